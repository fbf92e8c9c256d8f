# crashreplay_warnings(target): the project's own code builds with
# -Wall -Wextra -Werror; generated and third-party code does not. `pip
# install` (CRASHREPLAY_PYTHON_ONLY) drops -Werror: an install must not fail
# on a warning another compiler or optimisation level finds (GCC 12's
# -Wrestrict false positive inside std::string at -O3 stopped one); the
# development builds keep it.
function(crashreplay_warnings target)
  if(CRASHREPLAY_PYTHON_ONLY)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  else()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)
  endif()
endfunction()

# crashreplay_test(name SOURCES... LIBS ...): a GoogleTest binary registered
# with ctest, one ctest entry per TEST().
function(crashreplay_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  crashreplay_warnings(${name})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
    # Two properties, not one ENVIRONMENT list: gtest_discover_tests flattens
    # lists, so "A=1;B=2" would set only A.
    PROPERTIES ENVIRONMENT "CRASHREPLAY_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
               ENVIRONMENT_MODIFICATION "CRASHREPLAY_BINARY_DIR=set:${PROJECT_BINARY_DIR}")
endfunction()
