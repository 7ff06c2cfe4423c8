// SingleProcessComm: the one-rank Comm. Every collective is the identity.
#include <string>

#include "shardsafe/comm.h"

namespace shardsafe {
namespace {

class SingleProcessComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    return std::vector<std::string>{std::string(mine)};
  }
  Result<std::string> Broadcast(std::string_view data, int root) override {
    if (root != 0) {
      return InvalidArgumentError("broadcast root " + std::to_string(root) +
                                  " is not a rank of a group of 1");
    }
    return std::string(data);
  }
  Status Barrier() override { return Status(); }
};

}  // namespace

std::unique_ptr<Comm> MakeSingleProcessComm() { return std::make_unique<SingleProcessComm>(); }

}  // namespace shardsafe
