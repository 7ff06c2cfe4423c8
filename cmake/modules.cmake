# shardsafe_module(NAME DEPS ... [INCLUDES ...] [TEST_DEPS ...] [SEALED])
#
# One static library per module, ss_NAME (a NAME like engine/save gives
# ss_engine_save), from src/NAME/*.cc (tests, benchmarks and fuzzers
# excluded), with its dependencies spelled out. When tests are on,
# src/NAME/*_test.cc become one GoogleTest binary, ss_NAME_test, registered
# with CTest.
#
# The build enforces the module order: a module sees only the headers of
# itself and of the modules it depends on, directly or not. Each module gets
# an include tree of its own in the build directory, holding a link to
# src/M for each module M it may see (build/module_include/ss_NAME/engine/load
# -> src/engine/load, ...), and that tree, not src/, is its include path.
# Including another module's header ("engine/save/commit.h" from
# engine/load) fails to compile: tests/CMakeLists.txt checks that it does.
#
# A SEALED module (the engine) is seen from above only through the public
# headers, include/shardsafe/: the modules that depend on it see its
# dependencies outside it (base, format, ...) but none of its own folders.
# Its tests, and tests that list it in TEST_DEPS or call
# shardsafe_test_includes, see inside.

# The modules `target` may see: its own and those of every module in `deps`.
function(_shardsafe_visible out name deps)
  set(visible ${name})
  foreach(dep IN LISTS deps)
    if(TARGET ${dep})
      get_property(dep_visible GLOBAL PROPERTY SHARDSAFE_VISIBLE_${dep})
      list(APPEND visible ${dep_visible})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES visible)
  set(${out} ${visible} PARENT_SCOPE)
endfunction()

# Builds the include tree build/module_include/TREE linking each of
# `visible`'s src/ folders (a module inside a visible one needs no link).
function(_shardsafe_include_tree out tree visible)
  set(root ${PROJECT_BINARY_DIR}/module_include/${tree})
  file(REMOVE_RECURSE ${root})
  foreach(m IN LISTS visible)
    set(covered FALSE)
    foreach(other IN LISTS visible)
      if(NOT other STREQUAL m AND m MATCHES "^${other}/")
        set(covered TRUE)
      endif()
    endforeach()
    if(NOT covered)
      get_filename_component(parent ${root}/${m} DIRECTORY)
      file(MAKE_DIRECTORY ${parent})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${m} ${root}/${m} SYMBOLIC)
    endif()
  endforeach()
  set(${out} ${root} PARENT_SCOPE)
endfunction()

function(shardsafe_module name)
  cmake_parse_arguments(M "SEALED" "" "DEPS;INCLUDES;TEST_DEPS" ${ARGN})
  string(REPLACE "/" "_" target ss_${name})
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*.cc)
  list(FILTER srcs EXCLUDE REGEX "(_test|_benchmark|_fuzzer)\\.cc$")
  if(srcs)
    add_library(${target} STATIC ${srcs})
    set(scope PUBLIC)
  else()  # headers only
    add_library(${target} INTERFACE)
    set(scope INTERFACE)
  endif()
  _shardsafe_visible(visible ${name} "${M_DEPS}")
  _shardsafe_include_tree(tree ${target} "${visible}")
  if(M_SEALED)
    # Itself and its dependencies inside it privately; from outside, the
    # include trees of its dependencies outside it.
    set(outside ${visible})
    list(FILTER outside EXCLUDE REGEX "^${name}(/|$)")
    set_property(GLOBAL PROPERTY SHARDSAFE_VISIBLE_${target} ${outside})
    target_include_directories(${target} PRIVATE ${tree}
                               PUBLIC ${PROJECT_SOURCE_DIR}/include ${M_INCLUDES})
    target_link_libraries(${target} PRIVATE ${M_DEPS})
    foreach(m IN LISTS outside)
      string(REPLACE "/" "_" dep ss_${m})
      target_link_libraries(${target} PUBLIC ${dep})
    endforeach()
  else()
    set_property(GLOBAL PROPERTY SHARDSAFE_VISIBLE_${target} ${visible})
    target_include_directories(${target} ${scope} ${PROJECT_SOURCE_DIR}/include ${tree}
                               ${M_INCLUDES})
    target_link_libraries(${target} ${scope} ${M_DEPS})
  endif()
  if(SHARDSAFE_TESTS)
    file(GLOB tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*_test.cc)
    if(tests)
      find_package(GTest REQUIRED)
      add_executable(${target}_test ${tests})
      target_link_libraries(${target}_test PRIVATE ${target} ${M_TEST_DEPS} GTest::gtest
                            GTest::gtest_main GTest::gmock)
      shardsafe_test_includes(${target}_test ${target} ${M_TEST_DEPS})
      include(GoogleTest)
      gtest_discover_tests(${target}_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
    endif()
  endif()
endfunction()

# shardsafe_program_includes(TARGET NAME DEPS ...): the same include tree for
# a program's own sources in src/NAME (the cli, the Python extension), which
# sees itself and its dependencies' modules.
function(shardsafe_program_includes target name)
  _shardsafe_visible(visible ${name} "${ARGN}")
  _shardsafe_include_tree(tree ${target} "${visible}")
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include ${tree})
endfunction()

# shardsafe_test_includes(TARGET MODULE...): a test sees inside the listed
# module targets (their own include trees, which may be built later), sealed
# or not. Other libraries in the list are skipped.
function(shardsafe_test_includes target)
  foreach(m IN LISTS ARGN)
    if(m MATCHES "^ss_")
      target_include_directories(${target} PRIVATE ${PROJECT_BINARY_DIR}/module_include/${m})
    endif()
  endforeach()
endfunction()
