// libtorch_cpu.so of the Linux wheel needs libcupti.so.12 (from NVIDIA's pip
// packages) to load; its profiler (Kineto) calls CUPTI only to trace CUDA
// work. This stub lets it load without CUDA: every call fails. Only what
// libtorch_cpu.so imports is defined; the arguments are never read.

#define CUPTI_ERROR_UNKNOWN 999

int cuptiActivityDisable() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityEnable() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityEnableDriverApi() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityEnableRuntimeApi() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityFlushAll() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityGetNextRecord() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityGetNumDroppedRecords() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityPopExternalCorrelationId() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityPushExternalCorrelationId() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityRegisterCallbacks() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivityRegisterTimestampCallback() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiActivitySetAttribute() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiEnableCallback() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiEnableDomain() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiFinalize() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiGetVersion() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiSubscribe() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiUnsubscribe() {
  return CUPTI_ERROR_UNKNOWN;
}

int cuptiGetResultString(int result, const char** str) {
  (void)result;
  *str = "no CUPTI (stub libcupti of the MPS glue tests)";
  return 0;
}
