# ctest doc_snippets: builds the documentation's complete programs (target doc_snippets) and runs
# each in a scratch directory; a program that does not compile, fails or throws fails the test,
# naming the page and line its block starts at.
# -DBUILD_DIR=<Ember's build tree> -DSNIPPET_DIR=<this folder's build tree>
# -DORIGINS=<target>=<page>:<line>,...
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target doc_snippets
                RESULT_VARIABLE built OUTPUT_VARIABLE build_log ERROR_VARIABLE build_log)
if(NOT built EQUAL 0)
  message("${build_log}")
  message(FATAL_ERROR "doc_snippets: a program of the documentation does not compile (above)")
endif()
string(REPLACE "," ";" origins "${ORIGINS}")
set(scratch ${SNIPPET_DIR}/run)
set(failed "")
foreach(origin ${origins})
  string(REGEX REPLACE "=.*" "" name "${origin}")
  string(REGEX REPLACE "^[^=]*=" "" where "${origin}")
  file(REMOVE_RECURSE ${scratch})
  file(MAKE_DIRECTORY ${scratch})
  execute_process(COMMAND ${SNIPPET_DIR}/${name} WORKING_DIRECTORY ${scratch} TIMEOUT 120
                  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(status EQUAL 0)
    message("ok     ${where}")
  else()
    message("FAILED ${where} (${status}):\n${out}")
    list(APPEND failed ${where})
  endif()
endforeach()
file(REMOVE_RECURSE ${scratch})
if(failed)
  message(FATAL_ERROR "doc_snippets: these programs failed: ${failed}")
endif()
