// One rank saves a tensor and loads it back: the installed library alone.
#include <cstdio>
#include <string>

#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto comm = shardsafe::MakeSingleProcessComm();
  const float w[4] = {1, 2, 3, 4};
  shardsafe::SaveState state;
  state.tensors.push_back({"w", shardsafe::DType::kF32, {4},
                           {shardsafe::Box::Whole({4}), std::nullopt}, w});
  const std::string path = std::string(argv[1]) + "/step-1";
  if (auto saved = shardsafe::Save(state, path, *comm, {}); !saved.ok()) {
    std::fprintf(stderr, "%s\n", saved.status().ToString().c_str());
    return 1;
  }
  float back[4] = {};
  shardsafe::LoadRequest request;
  request.tensors.push_back({"w", shardsafe::DType::kF32, {4},
                             {shardsafe::Box::Whole({4}), std::nullopt}, back});
  if (auto loaded = shardsafe::Load(request, path, *comm, {}); !loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::printf("loaded w = [%g %g %g %g]\n", back[0], back[1], back[2], back[3]);
  return back[3] == 4 ? 0 : 1;
}
