# fattn — the optional CUDA backend (src/cuda). Included from the top-level
# CMakeLists.txt after the fattn target is defined.
#
#   FATTN_CUDA                AUTO (default): on when a CUDA compiler is found
#                             (check_language); ON: required; OFF: never
#   FATTN_CUDA_HEAD_DIMS      head dims the fused kernels are compiled for: the ONE list
#                             the per-dim instantiation files and the dispatcher's
#                             table (cuda/head_dims.hpp) are generated from
#   CMAKE_CUDA_ARCHITECTURES  default 80;90
#   FATTN_CUDA_WGMMA          AUTO (default): the Hopper wgmma kernel (sm_90a) is built when
#                             CMAKE_CUDA_ARCHITECTURES has a 90 entry; ON / OFF force it
#   FATTN_CUDA_WERROR         nvcc warnings are errors (host code: -Wall -Wextra too)
#   FATTN_CUDA_PTXAS_VERBOSE  ptxas prints registers, spills and shared memory per kernel
#   FATTN_BUILD_GPU_BENCH     gpu/fattn_gpu_bench (default: FATTN_BUILD_BENCH)
#
# Sets FATTN_WITH_CUDA (ON/OFF) for the rest of the build and for fattnConfig.cmake.

set(FATTN_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON, OFF")
set_property(CACHE FATTN_CUDA PROPERTY STRINGS AUTO ON OFF)
set(FATTN_CUDA_HEAD_DIMS "64;128;32;96;256" CACHE STRING
    "Head dims the fused CUDA kernels are compiled for (multiples of 16 in [16, 256])")
set(FATTN_CUDA_WGMMA AUTO CACHE STRING
    "Build the Hopper wgmma kernel for sm_90a: AUTO (architectures with 90), ON, OFF")
option(FATTN_CUDA_WERROR "Treat nvcc warnings as errors" OFF)
option(FATTN_CUDA_PTXAS_VERBOSE "Print ptxas resource usage of every CUDA kernel" OFF)

string(TOUPPER "${FATTN_CUDA}" _fattn_cuda_mode)
set(FATTN_WITH_CUDA OFF)
if(_fattn_cuda_mode STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(FATTN_WITH_CUDA ON)
  else()
    message(STATUS "fattn: no CUDA compiler found; building without the CUDA backend")
  endif()
elseif(_fattn_cuda_mode MATCHES "^(ON|TRUE|YES|Y|1)$")
  set(FATTN_WITH_CUDA ON)
elseif(NOT _fattn_cuda_mode MATCHES "^(OFF|FALSE|NO|N|0)$")
  message(FATAL_ERROR "FATTN_CUDA must be AUTO, ON or OFF, got '${FATTN_CUDA}'")
endif()
if(NOT FATTN_WITH_CUDA)
  return()
endif()

# sm_80 and sm_90 machine code (+ PTX). The Hopper-only wgmma kernel is built apart, for
# sm_90a (below).
set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build for")
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
message(STATUS "fattn: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
               "architectures ${CMAKE_CUDA_ARCHITECTURES}, head dims ${FATTN_CUDA_HEAD_DIMS})")
set(_fattn_cuda_targets)

# --- generated instantiations: one translation unit per (fused kernel, head dim) -------
set(_fattn_gen ${PROJECT_BINARY_DIR}/fattn_cuda_generated)
set(_fattn_dims ${FATTN_CUDA_HEAD_DIMS})
list(REMOVE_DUPLICATES _fattn_dims)
set(_fattn_gen_sources)
set(_fattn_wgmma_sources)
set(FATTN_GEN_HEAD_DIM_ITEMS "")
set(FATTN_GEN_WGMMA_HEAD_DIM_ITEMS "")
string(TOUPPER "${FATTN_CUDA_WGMMA}" _fattn_wgmma_mode)
if(_fattn_wgmma_mode STREQUAL "AUTO")
  set(_fattn_with_wgmma OFF)
  foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
    if(arch MATCHES "^90")
      set(_fattn_with_wgmma ON)
    endif()
  endforeach()
elseif(_fattn_wgmma_mode MATCHES "^(ON|TRUE|YES|Y|1)$")
  set(_fattn_with_wgmma ON)
elseif(_fattn_wgmma_mode MATCHES "^(OFF|FALSE|NO|N|0)$")
  set(_fattn_with_wgmma OFF)
else()
  message(FATAL_ERROR "FATTN_CUDA_WGMMA must be AUTO, ON or OFF, got '${FATTN_CUDA_WGMMA}'")
endif()
# The fused kernel families, one instance per element type: name, header, launcher
# (launchers.hpp declares every launcher with one signature, instantiate.cu.in writes it).
# One translation unit per instance and head dim, so the build runs them in parallel.
set(_fattn_fused_instances
  "mma_f16|fused_mma.cuh|launch_fused_mma<__half, @D@>"
  "mma_bf16|fused_mma.cuh|launch_fused_mma<__nv_bfloat16, @D@>"
  "tf32|fused_tf32.cuh|launch_fused_tf32<@D@>"
  "fma|fused_fma.cuh|launch_fused_fma<@D@>")
set(_fattn_wgmma_instances
  "wgmma_f16|fused_wgmma.cuh|launch_fused_wgmma<__half, @D@>"
  "wgmma_bf16|fused_wgmma.cuh|launch_fused_wgmma<__nv_bfloat16, @D@>")
set(_fattn_tma_instances
  "tma_f16|fused_tma.cuh|launch_fused_tma<__half, @D@>"
  "tma_bf16|fused_tma.cuh|launch_fused_tma<__nv_bfloat16, @D@>")
# Writes the translation unit of `instance` at head dim `dim`; its path into out_var.
function(_fattn_instance_file instance dim out_var)
  string(REPLACE "|" ";" parts "${instance}")
  list(GET parts 0 name)
  list(GET parts 1 FATTN_GEN_HEADER)
  list(GET parts 2 launcher)
  string(REPLACE "@D@" "${dim}" FATTN_GEN_LAUNCHER "${launcher}")
  set(file ${_fattn_gen}/fused_${name}_d${dim}.cu)
  configure_file(${PROJECT_SOURCE_DIR}/src/cuda/instantiate.cu.in ${file} @ONLY)
  set(${out_var} ${file} PARENT_SCOPE)
endfunction()

# The Hopper kernels exist for the dims of their tiles (tile_config.hpp: wgmma_head_dim,
# tma_head_dim). At head dim `dim`, if it is one of the list `dims_var` names: the
# translation units of the instances `instances_var` names (into the sm_90a sources) and
# X(dim) appended to `items_var` (head_dims.hpp's X-macro).
set(_fattn_wgmma_dims 64 128)
set(_fattn_tma_dims 64 128 256)
function(_fattn_hopper_instances dim dims_var instances_var items_var)
  if(NOT dim IN_LIST ${dims_var})
    return()
  endif()
  set(sources ${_fattn_wgmma_sources})
  foreach(instance IN LISTS ${instances_var})
    _fattn_instance_file(${instance} ${dim} _file)
    list(APPEND sources ${_file})
  endforeach()
  set(_fattn_wgmma_sources ${sources} PARENT_SCOPE)
  set(${items_var} "${${items_var}} X(${dim})" PARENT_SCOPE)
endfunction()

foreach(d IN LISTS _fattn_dims)
  if(NOT d MATCHES "^[0-9]+$")
    message(FATAL_ERROR "FATTN_CUDA_HEAD_DIMS: '${d}' is not a number")
  endif()
  math(EXPR _rem "${d} % 16")
  if(d LESS 16 OR d GREATER 256 OR NOT _rem EQUAL 0)
    message(FATAL_ERROR "FATTN_CUDA_HEAD_DIMS: ${d} must be a multiple of 16 in [16, 256]")
  endif()
  string(APPEND FATTN_GEN_HEAD_DIM_ITEMS " X(${d})")
  foreach(instance IN LISTS _fattn_fused_instances)
    _fattn_instance_file(${instance} ${d} _file)
    list(APPEND _fattn_gen_sources ${_file})
  endforeach()
  if(_fattn_with_wgmma)
    _fattn_hopper_instances(${d} _fattn_wgmma_dims _fattn_wgmma_instances
                            FATTN_GEN_WGMMA_HEAD_DIM_ITEMS)
    _fattn_hopper_instances(${d} _fattn_tma_dims _fattn_tma_instances
                            FATTN_GEN_TMA_HEAD_DIM_ITEMS)
  endif()
endforeach()
# The Hopper backward (backward_tma.cu) instantiates its head dims itself (64 and 128,
# tile_config.hpp's hopper_backward_head_dim), whatever FATTN_CUDA_HEAD_DIMS lists.
set(FATTN_GEN_BACKWARD_HEAD_DIM_ITEMS "")
if(_fattn_with_wgmma)
  list(APPEND _fattn_wgmma_sources ${PROJECT_SOURCE_DIR}/src/cuda/backward_tma.cu)
  set(FATTN_GEN_BACKWARD_HEAD_DIM_ITEMS " X(64) X(128)")
endif()
configure_file(${PROJECT_SOURCE_DIR}/src/cuda/head_dims.hpp.in ${_fattn_gen}/cuda/head_dims.hpp
               @ONLY)

# --- the backend: a static library linked into fattn --------------------------------
# A separate library rather than objects inside fattn: CMake (3.25) would then apply
# fattn's cxx_std_20 to CUDA too, and it knows no C++20 flag for nvcc. The CUDA
# sources are C++17.
add_library(fattn_cuda STATIC
  src/cuda/backward.cpp
  src/cuda/decode.cu
  src/cuda/device.cpp
  src/cuda/dispatch.cu
  src/cuda/kernels.cpp
  src/cuda/kvcache.cpp
  src/cuda/plan.cpp
  src/cuda/refusal.cpp
  src/cuda/table_choice.cpp
  src/cuda/naive.cu
  src/cuda/reference.cu
  src/cuda/repack.cu
  ${_fattn_gen_sources})
target_include_directories(fattn_cuda PRIVATE include src ${_fattn_gen})
set_target_properties(fattn_cuda PROPERTIES
  CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
  POSITION_INDEPENDENT_CODE ON)
target_link_libraries(fattn_cuda PUBLIC CUDA::cudart)

# The wgmma instantiations: sm_90a machine code only ("a": no other GPU runs it; the
# dispatcher launches it on compute capability 9.0 only). Their own static library,
# because CMake 3.25 has no "90a" architecture value: architectures OFF and the -gencode
# flag by hand.
if(_fattn_wgmma_sources)
  add_library(fattn_cuda_sm90a STATIC ${_fattn_wgmma_sources})
  target_include_directories(fattn_cuda_sm90a PRIVATE include src ${_fattn_gen})
  set_target_properties(fattn_cuda_sm90a PROPERTIES
    CUDA_ARCHITECTURES OFF CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
    POSITION_INDEPENDENT_CODE ON)
  target_compile_options(fattn_cuda_sm90a PRIVATE -gencode=arch=compute_90a,code=sm_90a -lineinfo)
  target_link_libraries(fattn_cuda_sm90a PUBLIC CUDA::cudart)
  target_link_libraries(fattn_cuda PRIVATE fattn_cuda_sm90a)
  install(TARGETS fattn_cuda_sm90a EXPORT fattnTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  list(APPEND _fattn_cuda_targets fattn_cuda_sm90a)
endif()
# -lineinfo: source lines in ncu and compute-sanitizer reports; no effect on the code.
target_compile_options(fattn_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
foreach(target IN ITEMS fattn_cuda ${_fattn_cuda_targets})
  # nvcc's options for the CUDA sources only: fattn_cuda also holds C++ sources
  # (device.cpp, plan.cpp, kernels.cpp) that the host compiler builds, and g++ rejects
  # -Xptxas / -Xcompiler / --Werror all-warnings.
  if(FATTN_CUDA_WERROR)
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings;-Xcompiler=-Wall,-Wextra>"
      "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Werror>")
  endif()
  if(FATTN_CUDA_PTXAS_VERBOSE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  endif()
endforeach()
install(TARGETS fattn_cuda EXPORT fattnTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

target_link_libraries(fattn PRIVATE fattn_cuda)
target_compile_definitions(fattn PRIVATE FATTN_WITH_CUDA=1)
# fattn_cuda calls back into fattn (the model's validation, dtype names). With both static,
# the linker must scan fattn again after fattn_cuda, for programs that enter the backend
# through a function that pulls none of those in (fattn::cuda_refusal); the INTERFACE link
# makes CMake repeat the pair, and changes nothing fattn_cuda is compiled with. A shared fattn
# holds both.
get_target_property(_fattn_type fattn TYPE)
if(_fattn_type STREQUAL "STATIC_LIBRARY")
  target_link_libraries(fattn_cuda INTERFACE fattn)
endif()

# --- which C++ kernels a GPU run verified: this build's SASS against the records ------------
# python/fattn/dispatch/machine_code.py reads the kernels' SASS (cuobjdump) from the built
# libraries and lists those whose hash a record of verified.json names, for
# src/cuda/verified.cpp (Impl::automatic takes the first verified candidate of the dispatch
# table; docs/dispatch.md). A library of its own, built after the kernels it reads. Without
# cuobjdump (the CUDA toolkit's, or Triton's bundled one in fattn's test environment) the
# list is empty: the library then knows of no verified kernel and warns where it runs one.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
file(GLOB _fattn_triton_cuobjdump
     "$ENV{HOME}/.cache/fattn/venv/lib/python3*/site-packages/triton/backends/nvidia/bin")
find_program(FATTN_CUOBJDUMP cuobjdump HINTS ${CUDAToolkit_BIN_DIR} ${_fattn_triton_cuobjdump})
if(NOT FATTN_CUOBJDUMP)
  message(STATUS "fattn: no cuobjdump: the C++ library will know of no verified GPU kernel")
  set(FATTN_CUOBJDUMP "")
endif()
set(_fattn_verified_list ${_fattn_gen}/cuda/verified_kernels.inc)
set(_fattn_dispatch_dir ${PROJECT_SOURCE_DIR}/python/fattn/dispatch)
set(_fattn_read_libraries $<TARGET_FILE:fattn_cuda>)
if(TARGET fattn_cuda_sm90a)
  list(APPEND _fattn_read_libraries $<TARGET_FILE:fattn_cuda_sm90a>)
endif()
add_custom_command(OUTPUT ${_fattn_verified_list}
  COMMAND ${CMAKE_COMMAND} -E env "CUOBJDUMP=${FATTN_CUOBJDUMP}" ${Python3_EXECUTABLE}
          ${_fattn_dispatch_dir}/machine_code.py verified-cpp
          --records ${_fattn_dispatch_dir}/verified.json --out ${_fattn_verified_list}
          ${_fattn_read_libraries}
  DEPENDS fattn_cuda ${_fattn_cuda_targets} ${_fattn_dispatch_dir}/verified.json
          ${_fattn_dispatch_dir}/table.json ${_fattn_dispatch_dir}/machine_code.py
  COMMENT "fattn: the C++ kernels a GPU run verified (their SASS against verified.json)"
  VERBATIM)
add_library(fattn_cuda_verified STATIC src/cuda/verified.cpp ${_fattn_verified_list})
target_include_directories(fattn_cuda_verified PRIVATE include src ${_fattn_gen})
set_target_properties(fattn_cuda_verified PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                      POSITION_INDEPENDENT_CODE ON)
target_link_libraries(fattn PRIVATE fattn_cuda_verified)
# fattn_cuda's Impl::automatic asks it: after fattn_cuda on a static link line (INTERFACE: no
# build order, which runs the other way)
target_link_libraries(fattn_cuda INTERFACE fattn_cuda_verified)
install(TARGETS fattn_cuda_verified EXPORT fattnTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

# --- the GPU benchmark and ncu driver (gpu/) -----------------------------------------
option(FATTN_BUILD_GPU_BENCH "Build gpu/fattn_gpu_bench" ${FATTN_BUILD_BENCH})
if(FATTN_BUILD_GPU_BENCH)
  add_subdirectory(gpu)
endif()
