// Must not compile: no product module (here hf, the top one, which sees
// every other) sees the test code in src/testing/ (CMakeLists.txt).
// Built only by the module_order_keeps_test_code_out test.
#include "testing/fault_injection.h"
