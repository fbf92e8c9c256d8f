# The CUDA backend, compiled into crashreplay_replay when CRASHREPLAY_HAVE_CUDA
# (cmake/Dependencies.cmake decides). Included from replay/CMakeLists.txt.
#
# Device code is compiled with --fmad=false so `a * b + c` in the shared CR_HD
# bodies is never contracted into an FMA: host and device then round the same
# way everywhere except in the transcendental functions (expf, sinf, cosf),
# which is what the per-dtype tolerances in tests/gpu cover.
file(GLOB CR_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cu ${CMAKE_CURRENT_LIST_DIR}/*.cc)
set(CR_NCCL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/nccl/nccl_comm.cc)
list(REMOVE_ITEM CR_CUDA_SOURCES ${CR_NCCL_SOURCES})
target_sources(crashreplay_replay PRIVATE ${CR_CUDA_SOURCES})
target_compile_definitions(crashreplay_replay PUBLIC CRASHREPLAY_HAVE_CUDA=1)
# CMake 3.25 does not know nvcc's C++20 flag (CMAKE_CUDA_STANDARD is 20).
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
target_compile_options(crashreplay_replay PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -Xcompiler=-Wall,-Wextra -Werror=all-warnings>)
target_link_libraries(crashreplay_replay PUBLIC CUDA::cudart_static)

# NCCL: linked only when both the header and the library are found.
find_path(CR_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include)
find_library(CR_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/local/cuda/lib)
if(CR_NCCL_INCLUDE_DIR AND CR_NCCL_LIBRARY)
  message(STATUS "crashreplay: NCCL found (${CR_NCCL_LIBRARY}), multi-GPU replay enabled")
  target_sources(crashreplay_replay PRIVATE ${CR_NCCL_SOURCES})
  target_include_directories(crashreplay_replay SYSTEM PRIVATE ${CR_NCCL_INCLUDE_DIR})
  target_compile_definitions(crashreplay_replay PUBLIC CRASHREPLAY_HAVE_NCCL=1)
  target_link_libraries(crashreplay_replay PUBLIC ${CR_NCCL_LIBRARY})
else()
  message(STATUS "crashreplay: NCCL not found, multi-GPU replay disabled (single-GPU rank emulation only)")
endif()
