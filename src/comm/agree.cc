#include "comm/agree.h"

#include "comm/wire.h"

namespace shardsafe {
namespace {

// Each rank's (status, payload) as GatherToRootOrFail sends it.
std::string StatusAndPayload(const Status& local, const std::string& payload) {
  wire::Writer w;
  w.Status(local);
  w.Str(local.ok() ? payload : std::string());
  return w.Take();
}

// The payloads of gathered StatusAndPayload messages, or the lowest
// failing rank's error.
Result<std::vector<std::string>> PayloadsOrFailure(const Comm& comm,
                                                   const std::vector<std::string>& all) {
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

}  // namespace

Status WithRank(const Comm& comm, int rank, const Status& s) {
  if (comm.size() == 1) return s;
  return s.WithContext("rank " + std::to_string(rank));
}

Result<std::vector<std::string>> GatherToRootOrFail(Comm& comm, int root, const Status& local,
                                                    std::string payload) {
  SS_ASSIGN_OR_RETURN(std::vector<std::string> all,
                      comm.Gather(StatusAndPayload(local, payload), root));
  if (comm.rank() != root) {
    if (!local.ok()) return local;
    return std::vector<std::string>();
  }
  return PayloadsOrFailure(comm, all);
}

Result<std::vector<std::string>> AllGatherOrFail(Comm& comm, const Status& local,
                                                 std::string payload) {
  SS_ASSIGN_OR_RETURN(std::vector<std::string> all,
                      comm.AllGather(StatusAndPayload(local, payload)));
  return PayloadsOrFailure(comm, all);
}

Result<std::vector<uint64_t>> ReduceMaxOrFail(Comm& comm, const Status& local,
                                              std::vector<uint64_t> values) {
  // First the lowest failing rank, as size - rank (0: none failed).
  values.insert(values.begin(), local.ok() ? 0 : comm.size() - comm.rank());
  SS_ASSIGN_OR_RETURN(std::vector<uint64_t> max, comm.AllReduceMax(values));
  if (max.empty() || max[0] > static_cast<uint64_t>(comm.size())) {
    return InternalError("AllReduceMax returned " + std::to_string(max.size()) + " values");
  }
  if (max[0] == 0) return std::vector<uint64_t>(max.begin() + 1, max.end());
  // Then its error, from it (the value is only read on that rank).
  const int failed = comm.size() - static_cast<int>(max[0]);
  Status s = BroadcastOrFail(comm, failed, local.ok() ? Result<std::string>("") : local).status();
  if (s.ok()) s = InternalError("rank " + std::to_string(failed) + " failed without an error");
  return s;
}

Status AgreeOnStatus(Comm& comm, const Status& local) {
  return ReduceMaxOrFail(comm, local, {}).status();
}

Result<std::string> ScatterOrFail(Comm& comm, int root, Result<std::vector<std::string>> parts) {
  std::vector<std::string> sent;
  if (comm.rank() == root) {
    if (parts.ok()) {
      sent = std::move(*parts);
      for (std::string& p : sent) p = StatusAndPayload(Status(), p);  // one part copied at a time
    } else {
      sent.assign(comm.size(), StatusAndPayload(parts.status(), ""));
    }
  }
  SS_ASSIGN_OR_RETURN(std::string mine, comm.Scatter(sent, root));
  wire::Reader reader(mine);
  Status s;
  SS_RETURN_IF_ERROR(reader.Status(&s));
  SS_RETURN_IF_ERROR(s);
  return reader.Str();
}

Result<std::string> BroadcastOrFail(Comm& comm, int root, const Result<std::string>& value,
                                    bool name_root) {
  wire::Writer w;
  if (comm.rank() == root) {
    w.Status(value.status());
    w.Str(value.ok() ? *value : std::string());
  }
  SS_ASSIGN_OR_RETURN(std::string msg, comm.Broadcast(w.Take(), root));
  wire::Reader reader(msg);
  Status s;
  SS_RETURN_IF_ERROR(reader.Status(&s));
  if (!s.ok()) return name_root ? WithRank(comm, root, s) : s;
  return reader.Str();
}

}  // namespace shardsafe
