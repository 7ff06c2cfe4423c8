// Must not compile: engine/plan (distributed planning) may not see
// engine/save, the module above it (cmake/modules.cmake). Built only by the
// module_order_keeps_planning_below_the_save test.
#include "engine/save/commit.h"
