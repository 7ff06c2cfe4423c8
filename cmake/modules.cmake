# shardsafe_module(NAME DEPS ... [INCLUDES ...])
#
# One static library per module, ss_NAME, from src/NAME/*.cc (tests,
# benchmarks and fuzzers excluded), with its dependencies spelled out so the
# build keeps the module order one-way. When tests are on, src/NAME/*_test.cc
# become one GoogleTest binary, ss_NAME_test, registered with CTest.
function(shardsafe_module name)
  cmake_parse_arguments(M "" "" "DEPS;INCLUDES" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*.cc)
  list(FILTER srcs EXCLUDE REGEX "(_test|_benchmark|_fuzzer)\\.cc$")
  if(srcs)
    add_library(ss_${name} STATIC ${srcs})
    set(scope PUBLIC)
  else()  # a module still being written: headers only
    add_library(ss_${name} INTERFACE)
    set(scope INTERFACE)
  endif()
  target_include_directories(ss_${name} ${scope} ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src ${M_INCLUDES})
  target_link_libraries(ss_${name} ${scope} ${M_DEPS})
  if(SHARDSAFE_TESTS)
    file(GLOB tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*_test.cc)
    if(tests)
      find_package(GTest REQUIRED)
      add_executable(ss_${name}_test ${tests})
      target_link_libraries(ss_${name}_test PRIVATE ss_${name} GTest::gtest GTest::gtest_main GTest::gmock)
      include(GoogleTest)
      gtest_discover_tests(ss_${name}_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
    endif()
  endif()
endfunction()
