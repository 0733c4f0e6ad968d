# examples.generate: the program's stdout equals llama2.c's greedy text for stories260K.
execute_process(COMMAND ${EXE} ${SRC}/data/models/stories260K/stories260K.bin ${SRC}/data/models/stories260K/tok512.bin
                OUTPUT_VARIABLE got RESULT_VARIABLE rc)
file(READ ${SRC}/tests/golden/llama2c_stories260K_greedy_200.txt want)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "generate exited with ${rc}")
endif()
string(STRIP "${got}" got)
string(STRIP "${want}" want)
if(NOT got STREQUAL want)
  message(FATAL_ERROR "generate printed:\n${got}\nllama2.c prints:\n${want}")
endif()
