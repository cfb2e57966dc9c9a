# `cmake --install` into a fresh prefix, as the README describes it: the program, the documents
# and the bundled model land where they should, and the installed program runs from there: it
# names its version and the installed petrel-tiny answers the README's question.
#
#   cmake -DBUILD_DIR=build -DPREFIX=/tmp/petrel-prefix -DVERSION=0.1.0 -P tests/install_test.cmake
foreach(var BUILD_DIR PREFIX VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed (${status}):\n${out}")
endif()

foreach(file bin/petrel share/doc/petrel/README.md share/doc/petrel/LICENSE share/doc/petrel/docs/design.md
             share/doc/petrel/docs/serving.md share/petrel/models/petrel-tiny/config.json
             share/petrel/models/petrel-tiny/model.safetensors share/petrel/models/petrel-tiny/tokenizer.json)
  if(NOT EXISTS "${PREFIX}/${file}")
    message(FATAL_ERROR "the install into ${PREFIX} lacks ${file}")
  endif()
endforeach()
if(EXISTS "${PREFIX}/share/petrel/models/petrel-tiny/reference")
  message(FATAL_ERROR "the install copied petrel-tiny's reference/ (training data for the tests only)")
endif()

execute_process(COMMAND "${PREFIX}/bin/petrel" --version RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT status EQUAL 0 OR NOT out STREQUAL "petrel ${VERSION}\n")
  message(FATAL_ERROR "${PREFIX}/bin/petrel --version: expected \"petrel ${VERSION}\", found (status ${status}):\n${out}")
endif()

execute_process(COMMAND "${PREFIX}/bin/petrel" run "${PREFIX}/share/petrel/models/petrel-tiny"
                        -p "What is 48213 + 9377?" --device cpu --threads 1 --temperature 0
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "Answer: 57590")
  message(FATAL_ERROR "the installed petrel-tiny: expected \"Answer: 57590\", found (status ${status}):\n${out}\n${err}")
endif()

file(REMOVE_RECURSE "${PREFIX}")
