# Writes a CTest file with one test per GoogleTest suite of TEST_EXECUTABLE (`Suite` runs
# --gtest_filter=Suite.*), run by CMakeLists.txt after each link of hearth_tests. Not a general
# GoogleTest module: no typed-test names, no per-test properties.
# Why suites and not tests: each process start pays libtorch's static initialisation (~1 s of CPU),
# and one process per test (gtest_discover_tests) made that ~40% of the suite's time.
# Inputs: TEST_EXECUTABLE, CTEST_FILE, WORKING_DIR, TIMEOUT.
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
                WORKING_DIRECTORY "${WORKING_DIR}" OUTPUT_VARIABLE listing RESULT_VARIABLE rc
                TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gtest_suites: ${TEST_EXECUTABLE} --gtest_list_tests failed (${rc}):\n${listing}")
endif()
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
set(count 0)
foreach(line IN LISTS lines)
  # Suite lines start in column 0 and end with '.', optionally followed by "  # TypeParam = ...".
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND script
      "add_test([==[${suite}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${suite}.*]==])\n"
      "set_tests_properties([==[${suite}]==] PROPERTIES WORKING_DIRECTORY [==[${WORKING_DIR}]==] TIMEOUT ${TIMEOUT})\n")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "gtest_suites: no suites listed by ${TEST_EXECUTABLE}")
endif()
file(WRITE "${CTEST_FILE}.new" "${script}")
file(RENAME "${CTEST_FILE}.new" "${CTEST_FILE}")
