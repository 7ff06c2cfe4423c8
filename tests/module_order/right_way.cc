// Must compile: engine/load may see engine/catalog, a module it depends on.
// The control for module_order_is_enforced: the same build fails only for
// the wrong-way include.
#include "engine/catalog/checkpoint_dir.h"
