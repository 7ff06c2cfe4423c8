// libshardsafe.so is built from the module libraries, linked whole
// (cmake/install.cmake); a shared library needs a source of its own.
