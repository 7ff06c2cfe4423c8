#include "comm/agree.h"

#include "comm/wire.h"

namespace shardsafe {
namespace {

Status WithRank(const Comm& comm, int rank, const Status& s) {
  if (comm.size() == 1) return s;
  return s.WithContext("rank " + std::to_string(rank));
}

}  // namespace

Result<std::vector<std::string>> GatherOrFail(Comm& comm, const Status& local,
                                              std::string payload) {
  wire::Writer w;
  w.Status(local);
  w.Str(local.ok() ? payload : std::string());
  SS_ASSIGN_OR_RETURN(std::vector<std::string> all, comm.AllGather(w.Take()));
  std::vector<std::string> payloads(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    wire::Reader reader(all[r]);
    Status s;
    SS_RETURN_IF_ERROR(reader.Status(&s));
    if (!s.ok()) return WithRank(comm, static_cast<int>(r), s);
    SS_ASSIGN_OR_RETURN(payloads[r], reader.Str());
  }
  return payloads;
}

Status AgreeOnStatus(Comm& comm, const Status& local) {
  return GatherOrFail(comm, local, {}).status();
}

Result<std::string> BroadcastOrFail(Comm& comm, int root, const Result<std::string>& value) {
  wire::Writer w;
  if (comm.rank() == root) {
    w.Status(value.status());
    w.Str(value.ok() ? *value : std::string());
  }
  SS_ASSIGN_OR_RETURN(std::string msg, comm.Broadcast(w.Take(), root));
  wire::Reader reader(msg);
  Status s;
  SS_RETURN_IF_ERROR(reader.Status(&s));
  if (!s.ok()) return WithRank(comm, root, s);
  return reader.Str();
}

}  // namespace shardsafe
