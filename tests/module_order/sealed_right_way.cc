// Must compile: above the engine, the public API and the modules below the
// engine are in sight. The control for module_order_seals_the_engine.
#include "format/safetensors.h"
#include "shardsafe/source.h"
#include "shardsafe/tools.h"
