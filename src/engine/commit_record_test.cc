// Commit records that cannot be trusted (docs/format.md §1): retention keeps
// their checkpoints, `latest` never goes back past them without saying so,
// `verify` reports them, and sequences never wrap.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/catalog/checkpoint_dir.h"
#include "shardsafe/tools.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kStep1[] = "step-00000001";
constexpr char kStep2[] = "step-00000002";
constexpr char kStep3[] = "step-00000003";
constexpr char kStep4[] = "step-00000004";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Sets `path`'s modification time to `seconds` after the epoch.
void SetMtime(const std::string& path, int64_t seconds) {
  const struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

// One way to spoil a commit record: what it does to ROOT/TAG/commit.json.
struct Spoil {
  const char* name;
  void (*apply)(const std::string& record, const std::string& scratch);
  const char* reason;  // in the fault
};

std::string Nested(int depth) {
  return "{\"sequence\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
}

const Spoil kSpoils[] = {
    {"Garbage", [](const std::string& r, const std::string&) { WriteText(r, "xx{"); },
     "not JSON"},
    {"Empty", [](const std::string& r, const std::string&) { WriteText(r, ""); }, "not JSON"},
    {"Over4KiB",
     [](const std::string& r, const std::string&) {
       WriteText(r, "{\"sequence\": 9, \"time_ns\": 1" + std::string(5000, ' ') + "}");
     },
     "more than the limit of 4096"},
    {"DeeplyNested",
     [](const std::string& r, const std::string&) { WriteText(r, Nested(1500)); },
     "is not a whole number"},
    {"NegativeSequence",
     [](const std::string& r, const std::string&) {
       WriteText(r, R"({"sequence": -1, "time_ns": 5, "moved_latest": true})");
     },
     "sequence -1 is not a whole number from 1 to 2^53"},
    {"HugeFloatSequence",
     [](const std::string& r, const std::string&) {
       WriteText(r, R"({"sequence": 1e30, "time_ns": 5, "moved_latest": true})");
     },
     "is not a whole number from 1 to 2^53"},
    {"DuplicateKeys",
     [](const std::string& r, const std::string&) {
       WriteText(r, R"({"sequence": 99, "time_ns": 5, "sequence": 1, "moved_latest": true})");
     },
     "field \"sequence\" appears twice"},
    {"Directory",
     [](const std::string& r, const std::string&) {
       fs::remove(r);
       fs::create_directory(r);
     },
     "is a directory"},
    {"SymlinkOutside",
     [](const std::string& r, const std::string& scratch) {
       // A well-formed record elsewhere: still not this checkpoint's.
       WriteText(scratch + "/commit.json", R"({"sequence": 1, "time_ns": 5})");
       fs::remove(r);
       fs::create_symlink(scratch + "/commit.json", r);
     },
     "leading outside"},
    {"DanglingSymlink",
     [](const std::string& r, const std::string& scratch) {
       fs::remove(r);
       fs::create_symlink(scratch + "/nothing-here", r);
     },
     "a symbolic link to nothing"},
    {"Fifo",
     [](const std::string& r, const std::string&) {
       fs::remove(r);
       ASSERT_EQ(mkfifo(r.c_str(), 0644), 0);
     },
     "not a regular file"},
    {"SequenceBeyondAnyCount",
     [](const std::string& r, const std::string&) {
       WriteText(r, R"({"sequence": 18446744073709551615, "time_ns": 5, "moved_latest": true})");
     },
     "sequence 18446744073709551615 is not a whole number from 1 to 2^53"},
};

class CommitRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("commit-record");
    root_ = dir_ + "/root";
    scratch_ = dir_ + "/elsewhere";
    fs::create_directories(root_);
    fs::create_directories(scratch_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Record(const std::string& tag) { return root_ + "/" + tag + "/commit.json"; }

  std::vector<std::string> Tags() {  // sorted: which are there, not their order
    std::vector<std::string> tags = testing::ListedTags(root_);
    std::sort(tags.begin(), tags.end());
    return tags;
  }

  const CheckpointInfo* Find(const std::vector<CheckpointInfo>& list, const std::string& tag) {
    for (const auto& c : list) {
      if (c.tag == tag) return &c;
    }
    return nullptr;
  }

  Result<SaveStats> SaveStep(CheckpointManager& m, int64_t step) {
    auto comm = MakeSingleProcessComm();
    const float data[4] = {1, 2, 3, static_cast<float>(step)};
    SaveState state;
    state.tensors.push_back({"w", DType::kF32, {4}, {Box::Whole({4}), std::nullopt}, data});
    state.values = "{\"step\":" + std::to_string(step) + "}";
    return m.Save(step, state, *comm, {});
  }

  Result<int64_t> LoadedStep(const std::string& path) {
    auto comm = MakeSingleProcessComm();
    SS_ASSIGN_OR_RETURN(LoadResult res, Load({}, path, *comm, {}));
    return Json::parse(res.values)["step"].get<int64_t>();
  }

  std::string dir_, root_, scratch_;
};

class SpoiledRecordTest : public CommitRecordTest,
                          public ::testing::WithParamInterface<Spoil> {};

// The issue's case: steps 1-3 saved, `latest` -> 3, step 3's record
// spoiled, then save(4) with keep_last=2. Retention used to take step 3 for
// the oldest and delete it.
TEST_P(SpoiledRecordTest, RetentionKeepsItAndVerifyReportsIt) {
  const Spoil& spoil = GetParam();
  CheckpointManager m(root_, {.keep_last = 0});
  for (int64_t step : {1, 2, 3}) ASSERT_TRUE(SaveStep(m, step).ok());
  spoil.apply(Record(kStep3), scratch_);

  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  const CheckpointInfo* spoiled = Find(*list, kStep3);
  ASSERT_NE(spoiled, nullptr);
  EXPECT_THAT(spoiled->order_fault, HasSubstr(Record(kStep3)));
  EXPECT_THAT(spoiled->order_fault, HasSubstr(spoil.reason));
  EXPECT_EQ(list->back().tag, kStep3) << "a checkpoint of unknown order is listed last";
  EXPECT_TRUE(spoiled->is_latest) << "`latest` names it and was written after it";

  VerifyReport root_report = VerifyCheckpoint(root_);
  EXPECT_THAT(root_report.faults, ::testing::Contains(HasSubstr(spoil.reason)));
  VerifyReport own_report = VerifyCheckpoint(root_ + "/" + kStep3);
  ASSERT_EQ(own_report.faults.size(), 1u);
  EXPECT_THAT(own_report.faults[0], HasSubstr(spoil.reason));

  CheckpointManager keep2(root_, {.keep_last = 2});
  auto saved = SaveStep(keep2, 4);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(Tags(), (std::vector<std::string>{kStep2, kStep3, kStep4}))
      << "kept: the newest 2 of known order and the one of unknown order";
  ASSERT_EQ(saved->warnings.size(), 1u);
  EXPECT_THAT(saved->warnings[0], HasSubstr("retention kept " + std::string(kStep3)));
  EXPECT_EQ(**keep2.LatestStep(), 4);
  EXPECT_EQ(*LoadedStep(root_), 4);

  // The new commit follows the trusted records (1, 2): no wrap, no jump.
  auto record = Json::parse(Slurp(Record(kStep4)));
  EXPECT_EQ(record["sequence"].get<uint64_t>(), 3u);

  // Without `latest`, step 3 may be the newest: resolving refuses to guess.
  fs::remove(root_ + "/latest");
  auto latest = keep2.LatestStep();
  ASSERT_FALSE(latest.ok());
  EXPECT_EQ(latest.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(latest.status().message(), HasSubstr(kStep3));
  auto loaded = LoadedStep(root_);
  ASSERT_FALSE(loaded.ok()) << "loaded step " << *loaded;
  EXPECT_THAT(loaded.status().message(), HasSubstr("cannot be told"));
  // A checkpoint loads by its path all the same.
  EXPECT_EQ(*LoadedStep(root_ + "/" + kStep3), 3);
}

INSTANTIATE_TEST_SUITE_P(Spoils, SpoiledRecordTest, ::testing::ValuesIn(kSpoils),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(CommitRecordTest, ExhaustedSequenceFailsTheSaveAndCommitsNothing) {
  CheckpointManager m(root_, {});
  for (int64_t step : {1, 2}) ASSERT_TRUE(SaveStep(m, step).ok());
  // The largest sequence a record may hold: valid, and the last.
  WriteText(Record(kStep2),
            R"({"sequence": 9007199254740992, "time_ns": 5, "moved_latest": true, "step": 2})");
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(Find(*list, kStep2)->order_fault.empty());

  auto saved = SaveStep(m, 3);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(saved.status().message(), HasSubstr("no commit sequence is left"));
  EXPECT_THAT(saved.status().message(), HasSubstr(kStep2));
  EXPECT_EQ(Tags(), (std::vector<std::string>{kStep1, kStep2}));
  EXPECT_EQ(**m.LatestStep(), 2);
}

TEST_F(CommitRecordTest, AMissingRecordAfterRecordsMakesTheOrderUnknown) {
  CheckpointManager m(root_, {});
  for (int64_t step : {1, 2}) ASSERT_TRUE(SaveStep(m, step).ok());
  fs::remove(Record(kStep2));
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(Find(*list, kStep2)->order_fault, HasSubstr("missing"));
  EXPECT_TRUE(Find(*list, kStep1)->order_fault.empty());

  CheckpointManager keep1(root_, {.keep_last = 1});
  ASSERT_TRUE(SaveStep(keep1, 3).ok());
  EXPECT_EQ(Tags(), (std::vector<std::string>{kStep2, kStep3}));
}

TEST_F(CommitRecordTest, ARootFromBeforeRecordsKeepsItsOrder) {
  CheckpointManager m(root_, {});
  for (int64_t step : {1, 2, 3}) ASSERT_TRUE(SaveStep(m, step).ok());
  for (const char* tag : {kStep1, kStep2, kStep3}) fs::remove(Record(tag));
  fs::remove(root_ + "/latest");
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  for (const auto& c : *list) EXPECT_TRUE(c.order_fault.empty()) << c.tag << ": " << c.order_fault;
  EXPECT_EQ(**m.LatestStep(), 3);
  EXPECT_TRUE(VerifyCheckpoint(root_).ok());
}

// A spoiled record whose index was written after `latest` may be a save
// whose update of `latest` failed: which is the latest cannot be told. One
// written before `latest` is behind it (a rollback names an older one).
TEST_F(CommitRecordTest, LatestIsUnknownOnlyWhenTheUnorderedOneMayBeNewer) {
  CheckpointManager m(root_, {});
  for (int64_t step : {1, 2, 3}) ASSERT_TRUE(SaveStep(m, step).ok());
  WriteText(Record(kStep3), "garbage");
  WriteText(root_ + "/latest", std::string(kStep2) + "\n");  // a rollback to step 2
  SetMtime(root_ + "/" + kStep3 + "/shardsafe.json", 1000);
  SetMtime(root_ + "/latest", 2000);
  EXPECT_EQ(**m.LatestStep(), 2);
  EXPECT_EQ(*LoadedStep(root_), 2);

  SetMtime(root_ + "/latest", 500);  // now step 3's index is the younger
  auto latest = m.LatestStep();
  ASSERT_FALSE(latest.ok());
  EXPECT_THAT(latest.status().message(), HasSubstr(kStep3));
  EXPECT_THAT(latest.status().message(), HasSubstr("may be newer than " + std::string(kStep2)));
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  for (const auto& c : *list) EXPECT_FALSE(c.is_latest) << c.tag;
  VerifyReport report = VerifyCheckpoint(root_);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.faults[0], HasSubstr("cannot be told"));
}

TEST_F(CommitRecordTest, PruneKeepsUnorderedCheckpointsAndSaysSo) {
  CheckpointManager m(root_, {});
  for (int64_t step : {1, 2, 3, 4}) ASSERT_TRUE(SaveStep(m, step).ok());
  WriteText(Record(kStep1), R"({"sequence": 0, "time_ns": 5})");
  std::vector<std::string> warnings;
  auto removed = m.Prune(1, &warnings);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, (std::vector<std::string>{kStep2, kStep3}));
  EXPECT_EQ(Tags(), (std::vector<std::string>{kStep1, kStep4}));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr(kStep1));
  EXPECT_THAT(warnings[0], HasSubstr("sequence 0 is not a whole number"));
}

TEST_F(CommitRecordTest, RecordFieldsOutOfRangeAreRefused) {
  CheckpointManager m(root_, {});
  ASSERT_TRUE(SaveStep(m, 1).ok());
  const std::string dir = root_ + "/" + kStep1;
  const std::pair<const char*, const char*> cases[] = {
      {R"([1, 2])", "not a JSON object"},
      {R"({"time_ns": 5})", "no sequence"},
      {R"({"sequence": 1})", "no time_ns"},
      {R"({"sequence": 1, "time_ns": -5})", "time_ns -5 is not a whole number"},
      {R"({"sequence": 1, "time_ns": 5, "step": 1.5})", "step 1.5 is not a whole number"},
      {R"({"sequence": 1, "time_ns": 5, "moved_latest": 1})", "moved_latest 1 is not a boolean"},
      {R"({"sequence": "1", "time_ns": 5})", "sequence \"1\" is not a whole number"},
      {R"({"sequence": 9007199254740993, "time_ns": 5})", "from 1 to 2^53"},
  };
  auto& files = *DefaultFileSystem();
  for (const auto& [text, reason] : cases) {
    WriteText(dir + "/commit.json", text);
    auto record = ReadCommitRecord(files, dir);
    ASSERT_FALSE(record.ok()) << text;
    EXPECT_EQ(record.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(record.status().message(), HasSubstr(reason)) << text;
  }
  WriteText(dir + "/commit.json", R"({"sequence": 7, "time_ns": 5, "step": 3, "extra": [1]})");
  auto record = ReadCommitRecord(files, dir);
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ((*record)->sequence, 7u);
  EXPECT_EQ((*record)->step, 3);
  fs::remove(dir + "/commit.json");
  record = ReadCommitRecord(files, dir);
  ASSERT_TRUE(record.ok());
  EXPECT_FALSE(record->has_value()) << "no record: a checkpoint from before records";
}

}  // namespace
}  // namespace shardsafe
