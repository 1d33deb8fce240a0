// libtorch_cpu.so of the Linux wheel needs libcudart.so.12 (from NVIDIA's pip
// packages) to load. This stub lets it load without CUDA: every call reports
// that there is no device. Only what libtorch_cpu.so imports is defined.

#define CUDA_ERROR_NO_DEVICE 100

int cudaGetDeviceCount(int* count) {
  *count = 0;
  return CUDA_ERROR_NO_DEVICE;
}

int cudaDriverGetVersion(int* version) {
  *version = 0;
  return CUDA_ERROR_NO_DEVICE;
}

int cudaRuntimeGetVersion(int* version) {
  *version = 0;
  return CUDA_ERROR_NO_DEVICE;
}

int cudaGetDeviceProperties_v2(void* properties, int device) {
  (void)properties;
  (void)device;
  return CUDA_ERROR_NO_DEVICE;
}

const char* cudaGetErrorString(int error) {
  (void)error;
  return "no CUDA device (stub libcudart of the MPS glue tests)";
}
