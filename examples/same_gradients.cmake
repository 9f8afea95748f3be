# examples/same_gradients.cmake — runs two examples and compares the text each prints between
# "---- gradients ----" and "---- end of gradients ----" (examples/print.hpp, print_gradients).
# Usage: cmake -DFIRST=prog1 -DSECOND=prog2 -P same_gradients.cmake
function(gradients_of program out)
  execute_process(COMMAND ${program} OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${program} exited with ${rc}")
  endif()
  string(FIND "${text}" "---- gradients ----" begin)
  string(FIND "${text}" "---- end of gradients ----" end)
  if(begin EQUAL -1 OR end EQUAL -1)
    message(FATAL_ERROR "${program} printed no gradients block")
  endif()
  math(EXPR length "${end} - ${begin}")
  string(SUBSTRING "${text}" ${begin} ${length} block)
  set(${out} "${block}" PARENT_SCOPE)
endfunction()

gradients_of(${FIRST} first)
gradients_of(${SECOND} second)
if(NOT first STREQUAL second)
  message(FATAL_ERROR "the gradients differ:\n${FIRST}:\n${first}\n${SECOND}:\n${second}")
endif()
message(STATUS "the same gradients:\n${first}")
