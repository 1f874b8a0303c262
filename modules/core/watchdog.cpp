#include "core/watchdog.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/launcher_guard.h"
#include "core/log.h"
#include "core/timer.h"

namespace mgbench::watchdog {
namespace {

// Census traffic on MPI_COMM_WORLD: point-to-point tags never match collectives' traffic, and
// mgbench sends no other point-to-point messages on it.
constexpr int kRequestTag = 0x6d67;  // "where are you?" (empty)
constexpr int kReplyTag = 0x6d68;    // the answer text
constexpr int kAnswerBytes = 256;
constexpr auto kTick = std::chrono::milliseconds(20);  // deadline and request check interval

struct Entry {
  std::string what;
  double start_s = 0;
  double deadline_s = 0;  // 0: none
  std::function<void()> on_expiry;
};

struct State {
  std::mutex mutex;
  std::condition_variable wake;
  std::map<std::uint64_t, Entry> entries;  // guarded by mutex
  std::uint64_t next_id = 1;
  bool stopping = false;
  std::thread thread;
  std::atomic<bool> running{false};
  std::atomic<double> default_timeout_s{0.0};
  std::once_flag expired;                            // one expiry per process: the job is going down
  std::optional<launcher_guard::Launcher> launcher;  // found by start(): this rank's Open MPI launcher
};

State& state() {
  static State s;  // never destroyed before the thread is joined (stop())
  return s;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

/// This rank's answer to a census: its open stages, oldest first.
std::string where_this_rank_is() {
  State& s = state();
  const double now = now_s();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::string out;
  for (const auto& [id, e] : s.entries) {  // ids grow with time: oldest first
    out += fmt::format("{}in {} for {:.0f} s", out.empty() ? "" : ", ", e.what, now - e.start_s);
  }
  if (out.empty()) out = "computing, in no blocking stage";
  if (out.size() >= kAnswerBytes) out = out.substr(0, kAnswerBytes - 4) + "...";
  return out;
}

/// Answers every census request waiting for this rank (matched probes: safe from any thread).
void answer_requests() {
  for (;;) {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, kRequestTag, MPI_COMM_WORLD, &flag, &message, &status) != MPI_SUCCESS ||
        flag == 0) {
      return;
    }
    MPI_Mrecv(nullptr, 0, MPI_BYTE, &message, MPI_STATUS_IGNORE);
    const std::string answer = where_this_rank_is();
    MPI_Send(answer.c_str(), static_cast<int>(answer.size()) + 1, MPI_CHAR, status.MPI_SOURCE, kReplyTag,
             MPI_COMM_WORLD);
  }
}

/// "0-3,5,7".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ",", ranks[i]);
    if (j > i) out += fmt::format("{}{}", j == i + 1 ? "," : "-", ranks[j]);
    i = j + 1;
  }
  return out;
}

std::mutex& recorder_mutex() {
  static std::mutex m;
  return m;
}
AbortRecorder& recorder() {
  static AbortRecorder r;
  return r;
}

/// Runs the recorder on a thread of its own, waiting up to kRecordWindowS: a recorder stuck on a
/// hung file system must not keep the rank alive.
void record(const std::string& message) {
  AbortRecorder r;
  {
    std::lock_guard<std::mutex> lock(recorder_mutex());
    r = recorder();
  }
  if (!r) return;
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([r, message, done] {
    try {
      r(message);
    } catch (...) {
      // the job ends anyway
    }
    done->store(true);
  }).detach();
  const double until = now_s() + kRecordWindowS;
  while (!done->load() && now_s() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!done->load()) log::error("rank {}: recording the abort in the results file did not finish", world_rank());
}

[[noreturn]] void expire(const std::string& what, double timeout_s, const std::function<void()>& on_expiry) {
  if (on_expiry) {
    try {
      on_expiry();
    } catch (...) {
      // the job ends anyway
    }
  }
  const std::string ranks = census();
  const std::string message = fmt::format(
      "{} did not complete in {:.0f} s (a peer rank died, hangs or is stopped){}; aborting the job "
      "(--comm-timeout)",
      what, timeout_s, ranks.empty() ? "" : "; the ranks: " + ranks);
  log::error("rank {}: {}", world_rank(), message);
  record(message);
  abort_job(1);
}

}  // namespace

void set_abort_recorder(AbortRecorder r) {
  std::lock_guard<std::mutex> lock(recorder_mutex());
  recorder() = std::move(r);
}

namespace {

void run() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  while (!s.stopping) {
    s.wake.wait_for(lock, kTick);
    if (s.stopping) break;
    const double now = now_s();
    const Entry* late = nullptr;
    for (const auto& [id, e] : s.entries) {
      if (e.deadline_s > 0 && now > e.deadline_s) {
        late = &e;
        break;
      }
    }
    if (late != nullptr) {
      const Entry copy = *late;
      lock.unlock();
      std::call_once(s.expired, [&] { expire(copy.what, copy.deadline_s - copy.start_s, copy.on_expiry); });
    }
    if (lock.owns_lock()) lock.unlock();
    answer_requests();
    lock.lock();
  }
}

}  // namespace

void start() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.running) return;
  s.launcher = launcher_guard::find_launcher();
  s.stopping = false;
  s.thread = std::thread(run);
  s.running = true;
}

void stop() {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.running) return;
    s.stopping = true;
  }
  s.wake.notify_all();
  s.thread.join();
  s.running = false;
}

void set_default_timeout(double seconds) { state().default_timeout_s = seconds; }
double default_timeout() { return state().default_timeout_s; }

Deadline::Deadline(std::string what, double timeout_s, std::function<void()> on_expiry) {
  State& s = state();
  if (timeout_s < 0) timeout_s = s.default_timeout_s;
  const double now = now_s();
  std::lock_guard<std::mutex> lock(s.mutex);
  id_ = s.next_id++;
  s.entries.emplace(id_, Entry{std::move(what), now, timeout_s > 0 ? now + timeout_s : 0, std::move(on_expiry)});
}

Deadline::~Deadline() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.entries.erase(id_);
}

void abort_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  const int rank = world_rank();
  if (const auto& launcher = state().launcher) launcher_guard::arm(*launcher, launcher_guard::kGraceS, rank);
  // MPI_Abort cannot return while the launcher's daemon is unreachable: then this rank ends itself.
  std::thread([exit_code] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortWindowS));
    std::_Exit(exit_code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

std::string census(double window_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return "";
  std::vector<MPI_Request> replies;
  std::vector<int> peers;
  std::vector<std::array<char, kAnswerBytes>> answers(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Isend(nullptr, 0, MPI_BYTE, r, kRequestTag, MPI_COMM_WORLD, &request);
    MPI_Request_free(&request);  // an empty message: nothing to keep alive
    MPI_Request reply = MPI_REQUEST_NULL;
    MPI_Irecv(answers[static_cast<std::size_t>(r)].data(), kAnswerBytes, MPI_CHAR, r, kReplyTag, MPI_COMM_WORLD,
              &reply);
    replies.push_back(reply);
    peers.push_back(r);
  }
  const double deadline = now_s() + window_s;
  for (;;) {
    int all = 0;
    MPI_Testall(static_cast<int>(replies.size()), replies.data(), &all, MPI_STATUSES_IGNORE);
    if (all != 0 || now_s() > deadline) break;
    answer_requests();  // another rank may be taking its census at the same moment
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Group the ranks by answer, this rank first.
  std::map<std::string, std::vector<int>> by_answer;
  by_answer[where_this_rank_is()].push_back(rank);
  const std::string silent = fmt::format("no answer in {:.0f} s (stopped, or hung outside MPI)", window_s);
  for (std::size_t i = 0; i < replies.size(); ++i) {
    const int r = peers[i];
    if (replies[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&replies[i]);
      MPI_Request_free(&replies[i]);
      by_answer[silent].push_back(r);
    } else {
      auto& a = answers[static_cast<std::size_t>(r)];
      a.back() = '\0';
      by_answer[a.data()].push_back(r);
    }
  }
  std::vector<std::pair<std::string, std::vector<int>>> groups(by_answer.begin(), by_answer.end());
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::string out;
  for (auto& [answer, ranks] : groups) {
    std::sort(ranks.begin(), ranks.end());
    out +=
        fmt::format("{}rank{} {}: {}", out.empty() ? "" : "; ", ranks.size() > 1 ? "s" : "", rank_list(ranks), answer);
  }
  return out;
}

}  // namespace mgbench::watchdog
