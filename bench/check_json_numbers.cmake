# The smoke tests' check of fattn-bench's --json output: each key is there and its value
# a number above 0. cmake -DJSON_FILE=file.json -DKEYS="machine/read_bandwidth_gbs;..."
# -P check_json_numbers.cmake; a key is a path of members (or array indices) joined by "/".
if(NOT EXISTS "${JSON_FILE}")
  message(FATAL_ERROR "${JSON_FILE}: no such file (did the bench test before this one fail?)")
endif()
file(READ "${JSON_FILE}" document)
foreach(key IN LISTS KEYS)
  string(REPLACE "/" ";" path "${key}")
  string(JSON value ERROR_VARIABLE error GET "${document}" ${path})
  if(error)
    message(FATAL_ERROR "${JSON_FILE}: ${key}: ${error}")
  endif()
  if(NOT value GREATER 0)
    message(FATAL_ERROR "${JSON_FILE}: ${key} is '${value}', expected a number above 0")
  endif()
  message(STATUS "${key} = ${value}")
endforeach()
