# fattn — the GPU dispatch table (python/fattn/dispatch/table.json) as C++ data. Included
# from the top-level CMakeLists.txt after the fattn target is defined, before cuda.cmake.
#
# The Python operators read the JSON; the C++ library's Impl::automatic and the KV-cache
# operator's choice read the same rows through a header generated here at configure time:
# cuda/dispatch_table.hpp (the types: src/cuda/dispatch_rows.hpp). An edit of the JSON
# reconfigures (CMAKE_CONFIGURE_DEPENDS). A row naming a kernel the table does not define,
# or a field with a value the table's "about" does not describe, stops the configuration.
#
# Sets FATTN_DISPATCH_GENERATED_DIR: the folder to put on an include path for
# "cuda/dispatch_table.hpp". It is the CUDA backend's folder of generated headers
# (cmake/cuda.cmake's, where cuda/head_dims.hpp is), already on fattn_cuda's include path.

set(FATTN_DISPATCH_TABLE ${PROJECT_SOURCE_DIR}/python/fattn/dispatch/table.json)
set(FATTN_DISPATCH_GENERATED_DIR ${PROJECT_BINARY_DIR}/fattn_cuda_generated)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${FATTN_DISPATCH_TABLE})
file(READ ${FATTN_DISPATCH_TABLE} _fattn_dispatch_json)

# Names become C++ string literals: letters, digits and _ . * only.
function(_fattn_dispatch_name value where)
  if(NOT value MATCHES "^[A-Za-z0-9_.*]+$")
    message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: ${where}: '${value}' is not a name")
  endif()
endfunction()

# The JSON array at ARGN as a CMake list (its items as they are).
function(_fattn_dispatch_array out)
  string(JSON n LENGTH "${_fattn_dispatch_json}" ${ARGN})
  set(items)
  if(n GREATER 0)
    math(EXPR last "${n} - 1")
    foreach(i RANGE ${last})
      string(JSON item GET "${_fattn_dispatch_json}" ${ARGN} ${i})
      list(APPEND items "${item}")
    endforeach()
  endif()
  set(${out} "${items}" PARENT_SCOPE)
endfunction()

# One field of a row ("*" or a list) as a Choices<type> initializer; a listed one's items
# become the array `array` (appended to the text in `decls`).
function(_fattn_dispatch_choices out decls array type quote)
  string(JSON kind TYPE "${_fattn_dispatch_json}" ${ARGN})
  if(kind STREQUAL "STRING")
    string(JSON value GET "${_fattn_dispatch_json}" ${ARGN})
    if(NOT value STREQUAL "*")
      message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: ${ARGN}: '${value}' is neither \"*\" nor a list")
    endif()
    set(${out} "{true, nullptr, 0}" PARENT_SCOPE)
    return()
  endif()
  _fattn_dispatch_array(items ${ARGN})
  list(LENGTH items n)
  if(n EQUAL 0)  # an empty list admits nothing
    set(${out} "{false, nullptr, 0}" PARENT_SCOPE)
    return()
  endif()
  set(literals)
  foreach(item IN LISTS items)
    _fattn_dispatch_name("${item}" "${ARGN}")
    list(APPEND literals "${quote}${item}${quote}")
  endforeach()
  list(JOIN literals ", " literals)
  set(${decls} "${${decls}}inline constexpr ${type} ${array}[] = {${literals}};\n" PARENT_SCOPE)
  set(${out} "{false, ${array}, ${n}}" PARENT_SCOPE)
endfunction()

# A row's "variants" and "attn_mask" as the enumerators of dispatch_rows.hpp.
function(_fattn_dispatch_rules out)
  string(JSON variants GET "${_fattn_dispatch_json}" ${ARGN} variants)
  if(NOT variants MATCHES "^(any|none|some)$")
    message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: ${ARGN}: variants '${variants}' is not any, none or some")
  endif()
  string(JSON mask_kind TYPE "${_fattn_dispatch_json}" ${ARGN} attn_mask)
  string(JSON mask GET "${_fattn_dispatch_json}" ${ARGN} attn_mask)
  if(mask_kind STREQUAL "BOOLEAN")
    if(mask)
      set(mask_rule with)
    else()
      set(mask_rule without)
    endif()
  elseif(mask STREQUAL "any")
    set(mask_rule any)
  else()
    message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: ${ARGN}: attn_mask '${mask}' is not true, false or \"any\"")
  endif()
  set(${out} "VariantsRule::${variants}, MaskRule::${mask_rule}" PARENT_SCOPE)
endfunction()

# The kernels: name, engine, impl, and whether a GPU ever ran them (gpu_run not null).
string(JSON _fattn_kernel_count LENGTH "${_fattn_dispatch_json}" kernels)
math(EXPR _last "${_fattn_kernel_count} - 1")
set(_fattn_kernel_names)
set(_fattn_kernel_rows)
foreach(i RANGE ${_last})
  string(JSON name MEMBER "${_fattn_dispatch_json}" kernels ${i})
  string(JSON engine GET "${_fattn_dispatch_json}" kernels ${name} engine)
  string(JSON impl GET "${_fattn_dispatch_json}" kernels ${name} impl)
  string(JSON gpu_run_type TYPE "${_fattn_dispatch_json}" kernels ${name} gpu_run)
  if(gpu_run_type STREQUAL "NULL")
    set(ran_on_gpu false)
  elseif(gpu_run_type STREQUAL "STRING")
    set(ran_on_gpu true)
  else()
    message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: kernels ${name}: gpu_run must be an evidence file or null")
  endif()
  _fattn_dispatch_name("${name}" "kernels")
  _fattn_dispatch_name("${impl}" "kernels ${name} impl")
  if(NOT engine MATCHES "^(cuda_cpp|triton)$")
    message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: kernels ${name}: engine '${engine}' is not cuda_cpp or triton")
  endif()
  list(APPEND _fattn_kernel_names ${name})
  string(APPEND _fattn_kernel_rows "    {\"${name}\", Engine::${engine}, \"${impl}\", ${ran_on_gpu}},\n")
endforeach()

# The entries: per row its fields' arrays, then the rows, then the entry.
set(_fattn_decls "")
set(_fattn_entry_rows "")
string(JSON _fattn_entry_count LENGTH "${_fattn_dispatch_json}" entries)
math(EXPR _last "${_fattn_entry_count} - 1")
foreach(e RANGE ${_last})
  string(JSON entry MEMBER "${_fattn_dispatch_json}" entries ${e})
  _fattn_dispatch_name("${entry}" "entries")
  string(JSON row_count LENGTH "${_fattn_dispatch_json}" entries ${entry})
  if(row_count EQUAL 0)
    message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: entries ${entry} has no row")
  endif()
  math(EXPR last_row "${row_count} - 1")
  set(rows "")
  set(emitted 0)
  foreach(r RANGE ${last_row})
    set(path entries ${entry} ${r})
    set(prefix "entry${e}_row${r}")
    # A row that "needs" dropout or seqused_k routes calls the C++ kernels take none of
    # (the Python dispatch alone reads it): not in the C++ table.
    string(JSON needs_type ERROR_VARIABLE needs_missing TYPE "${_fattn_dispatch_json}" ${path} needs)
    if(NOT needs_missing)
      continue()
    endif()
    math(EXPR emitted "${emitted} + 1")
    _fattn_dispatch_choices(architectures _fattn_decls ${prefix}_architectures std::string_view "\"" ${path} architectures)
    _fattn_dispatch_choices(dtypes _fattn_decls ${prefix}_dtypes std::string_view "\"" ${path} dtypes)
    _fattn_dispatch_choices(head_dims _fattn_decls ${prefix}_head_dims std::int64_t "" ${path} head_dims)
    _fattn_dispatch_rules(rules ${path})
    _fattn_dispatch_array(candidates ${path} candidates)
    list(LENGTH candidates n)
    if(n EQUAL 0)
      message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: ${path}: no candidates")
    endif()
    set(literals)
    foreach(c IN LISTS candidates)
      if(NOT c IN_LIST _fattn_kernel_names)
        message(FATAL_ERROR "${FATTN_DISPATCH_TABLE}: ${path}: candidate '${c}' is not one of its kernels")
      endif()
      list(APPEND literals "\"${c}\"")
    endforeach()
    list(JOIN literals ", " literals)
    string(APPEND _fattn_decls "inline constexpr std::string_view ${prefix}_candidates[] = {${literals}};\n")
    string(APPEND rows "    {${architectures}, ${dtypes}, ${head_dims}, ${rules}, ${prefix}_candidates, ${n}},\n")
  endforeach()
  string(APPEND _fattn_decls "inline constexpr Row entry${e}_rows[] = {\n${rows}};\n")
  string(APPEND _fattn_entry_rows "    {\"${entry}\", table_data::entry${e}_rows, ${emitted}},\n")
endforeach()

set(_fattn_dispatch_header "// Generated by cmake/dispatch.cmake from python/fattn/dispatch/table.json: edit the JSON.
// The table's kernels and, per entry, its rows in order (the first that matches a call wins).
#pragma once

#include <cstdint>
#include <string_view>

#include \"cuda/dispatch_rows.hpp\"

namespace fattn::dispatch {
namespace table_data {
${_fattn_decls}}  // namespace table_data

inline constexpr KernelRow kKernels[] = {
${_fattn_kernel_rows}};

inline constexpr Entry kEntries[] = {
${_fattn_entry_rows}};

}  // namespace fattn::dispatch
")
# Written through configure_file, which touches the header only when its text changes.
file(WRITE ${PROJECT_BINARY_DIR}/CMakeFiles/dispatch_table.hpp.tmp "${_fattn_dispatch_header}")
configure_file(${PROJECT_BINARY_DIR}/CMakeFiles/dispatch_table.hpp.tmp
               ${FATTN_DISPATCH_GENERATED_DIR}/cuda/dispatch_table.hpp COPYONLY)
target_include_directories(fattn PRIVATE ${FATTN_DISPATCH_GENERATED_DIR})
