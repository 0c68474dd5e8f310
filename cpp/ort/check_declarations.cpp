// opbridge_check_declarations LIBRARY: the build's check of an ORT custom-op library's declarations
// (opbridge_add_op() runs it after linking lib<name>_ort.so). Exits 1, naming each misdeclared op
// and what is wrong with it, and removes the library (as a failed link leaves none, so that the
// next build links and checks it again); exits 0 when every declaration is sound. Where the library
// cannot be loaded here (a cross build, a sanitizer runtime that must come first), it says so and
// exits 0: importing the library in Python reports the same errors.
//
// The library's declarations run when it is loaded (they are plain C++ objects, not constants), so
// they are read from the built library itself, through OpbridgeDeclarationErrors: no ONNX Runtime,
// torch or Python is needed.
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s lib<name>_ort.so\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "opbridge: warning: cannot load %s to check its ops' declarations here (%s); importing it "
                 "in Python checks them\n", path, dlerror());
    return 0;
  }
  using Errors = const char* (*)();
  const auto errors = reinterpret_cast<Errors>(dlsym(lib, "OpbridgeDeclarationErrors"));
  if (errors == nullptr) {
    std::fprintf(stderr, "opbridge: %s has no OpbridgeDeclarationErrors entry point: it is not an ORT library "
                 "made by opbridge_add_op() of this opbridge\n", path);
    return 1;
  }
  const char* text = errors();
  if (text == nullptr || *text == '\0') return 0;
  std::fprintf(stderr, "opbridge: %s: misdeclared ops, which torch and ONNX Runtime would refuse; fix their "
               "declarations:\n%s", path, text);
  std::remove(path);
  return 1;
}
