// Must not compile: above the engine (hf, cli, python), its headers are out
// of sight; the public API is include/shardsafe/ (cmake/modules.cmake).
// Built only by the module_order_seals_the_engine test.
#include "engine/load/load_internal.h"
