// Must compile: what links ss_testing (the tests) sees its headers. The
// control for module_order_keeps_test_code_out.
#include "testing/fault_injection.h"
#include "testing/test_util.h"
