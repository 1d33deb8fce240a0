# Sanitizer builds shared by the harness (CMakeLists.txt) and the glue tests
# (tests/glue): MPS_SANITIZER is '', 'thread' or 'address' (ASan + UBSan,
# every UBSan finding fatal).
set(MPS_SANITIZER "" CACHE STRING "Sanitizer build: '', 'thread' or 'address'")
if(MPS_SANITIZER STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(MPS_SANITIZER STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(NOT MPS_SANITIZER STREQUAL "")
  message(FATAL_ERROR "MPS_SANITIZER must be '', 'thread' or 'address'")
endif()
