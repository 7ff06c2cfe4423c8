// Must not compile: engine/load may not see engine/save (cmake/modules.cmake).
// Built only by the module_order_is_enforced test.
#include "engine/save/commit.h"
