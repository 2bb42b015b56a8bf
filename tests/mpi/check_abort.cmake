# CTest's check of a failing rank: runs `MPIEXEC -np 2 FLAGS PROGRAM MODE` and passes when the job
# ended non-zero, within LIMIT seconds, with MESSAGE in its output. FLAGS separates its words
# with '|'.
string(REPLACE "|" ";" flags "${FLAGS}")
string(TIMESTAMP start "%s")
execute_process(COMMAND ${MPIEXEC} -np 2 ${flags} ${PROGRAM} ${MODE}
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP stop "%s")
math(EXPR took "${stop} - ${start}")
message("${out}${err}")
if("${status}" STREQUAL "0")
  message(FATAL_ERROR "the job exited 0; rank 1's failure should have ended it non-zero")
endif()
if(NOT "${status}" MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself: ${status}")
endif()
if(NOT "${out}${err}" MATCHES "${MESSAGE}")
  message(FATAL_ERROR "the output lacks rank 1's message '${MESSAGE}'")
endif()
if(took GREATER LIMIT)
  message(FATAL_ERROR "the job took ${took} s to end, more than ${LIMIT} s")
endif()
message("ok: mode ${MODE} ended the job with status ${status} in ${took} s")
