#include "crashreplay/bisect/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace crashreplay::bisect {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Resolves argv[0] against PATH (from the child's environment) in the parent,
// so that the child only has to call execve.
std::optional<std::string> ResolveExecutable(const std::string& name, const std::string& path_env) {
  auto executable = [](const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (executable(name)) return name;
    return std::nullopt;
  }
  for (absl::string_view dir : absl::StrSplit(path_env, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (executable(candidate)) return candidate;
  }
  return std::nullopt;
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

std::string SignalName(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return absl::StrCat("signal ", sig);
  }
}

ProcessResult RunProcess(const ProcessSpec& spec) {
  ProcessResult r;
  if (spec.argv.empty()) {
    r.start_error = "empty command";
    return r;
  }
  // The child's environment, built here because the child may not allocate.
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
  }
  for (const auto& [k, v] : spec.env_set) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = spec.argv;
  std::vector<char*> argv;
  for (auto& s : argv_copy) argv.push_back(s.data());
  argv.push_back(nullptr);

  const auto path_it = env.find("PATH");
  const std::optional<std::string> exe =
      ResolveExecutable(spec.argv[0], path_it != env.end() ? path_it->second : "/usr/bin:/bin");
  if (!exe) {
    r.start_error = absl::StrCat("command not found or not executable: '", spec.argv[0], "'");
    return r;
  }

  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    r.start_error = absl::StrCat("pipe: ", std::strerror(errno));
    return r;
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    r.start_error = absl::StrCat("pipe: ", std::strerror(errno));
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return r;
  }
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    r.start_error = absl::StrCat("pipe: ", std::strerror(errno));
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    return r;
  }
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  struct rlimit mem_limit{};
  if (spec.memory_limit_bytes) mem_limit.rlim_cur = mem_limit.rlim_max = *spec.memory_limit_bytes;
  const char* workdir = spec.working_dir.empty() ? nullptr : spec.working_dir.c_str();

  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    r.start_error = absl::StrCat("fork: ", std::strerror(errno));
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], exec_pipe[0], exec_pipe[1], devnull})
      ::close(fd);
    return r;
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    ::setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    int err = 0;
    if (spec.memory_limit_bytes && ::setrlimit(RLIMIT_AS, &mem_limit) != 0) err = errno;
    if (err == 0 && workdir != nullptr && ::chdir(workdir) != 0) err = errno;
    if (err == 0) {
      ::execve(exe->c_str(), argv.data(), envp.data());
      err = errno;
    }
    ssize_t ignored = ::write(exec_pipe[1], &err, sizeof(err));
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we may signal it
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ::close(exec_pipe[1]);
  if (devnull >= 0) ::close(devnull);

  int exec_errno = 0;
  const ssize_t got = ::read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  ::close(exec_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(exec_errno))) {
    int status;
    ::waitpid(pid, &status, 0);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    r.start_error = absl::StrCat("cannot run '", spec.argv[0], "': ", std::strerror(exec_errno));
    return r;
  }
  r.started = true;
  SetNonBlocking(out_pipe[0]);
  SetNonBlocking(err_pipe[0]);

  int fds[2] = {out_pipe[0], err_pipe[0]};
  bool open_fd[2] = {true, true};
  std::optional<Clock::time_point> term_sent;
  bool killed = false;
  int status = 0;
  bool reaped = false;
  char buf[65536];
  auto drain = [&](int which) {
    while (true) {
      const ssize_t n = ::read(fds[which], buf, sizeof(buf));
      if (n > 0) {
        if (which == 0) {
          const size_t room = spec.stdout_limit - std::min(spec.stdout_limit, r.stdout_text.size());
          r.stdout_text.append(buf, std::min<size_t>(room, static_cast<size_t>(n)));
          if (static_cast<size_t>(n) > room) r.stdout_truncated = true;
        } else {
          const size_t head_room = spec.stderr_head_limit - std::min(spec.stderr_head_limit, r.stderr_head.size());
          r.stderr_head.append(buf, std::min<size_t>(head_room, static_cast<size_t>(n)));
          r.stderr_bytes += static_cast<uint64_t>(n);
          r.stderr_tail.append(buf, static_cast<size_t>(n));
          if (r.stderr_tail.size() > 2 * spec.stderr_limit) {
            r.stderr_tail.erase(0, r.stderr_tail.size() - spec.stderr_limit);
          }
        }
        continue;
      }
      if (n == 0) {
        ::close(fds[which]);
        open_fd[which] = false;
      }
      return;  // EAGAIN or error: try again later
    }
  };
  auto signal_group = [&](int sig) { ::kill(-pid, sig); };

  while (!reaped) {
    pollfd pfds[2];
    nfds_t count = 0;
    int map[2];
    for (int i = 0; i < 2; ++i) {
      if (!open_fd[i]) continue;
      pfds[count] = {fds[i], POLLIN, 0};
      map[count++] = i;
    }
    const int wait_ms = count > 0 ? 50 : 10;
    if (count > 0) {
      if (::poll(pfds, count, wait_ms) > 0) {
        for (nfds_t k = 0; k < count; ++k)
          if (pfds[k].revents != 0) drain(map[k]);
      }
    } else {
      ::usleep(wait_ms * 1000);
    }
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      reaped = true;
      break;
    }
    const auto now = Clock::now();
    const bool cancel = spec.cancel != nullptr && spec.cancel->load();
    const bool over_time = spec.timeout_s && Seconds(now - start) > *spec.timeout_s;
    if (!term_sent && (cancel || over_time)) {
      if (over_time && !cancel) r.timed_out = true;
      if (cancel) r.cancelled = true;
      signal_group(SIGTERM);
      term_sent = now;
    } else if (term_sent && !killed && Seconds(now - *term_sent) > spec.kill_grace_s) {
      signal_group(SIGKILL);
      killed = true;
    }
  }
  r.duration_s = Seconds(Clock::now() - start);
  // Stragglers in the group (background children) would hold the pipes open.
  signal_group(SIGKILL);
  for (int i = 0; i < 2; ++i) {
    if (!open_fd[i]) continue;
    drain(i);
    if (open_fd[i]) ::close(fds[i]);
  }
  if (r.stderr_tail.size() > spec.stderr_limit) {
    r.stderr_tail.erase(0, r.stderr_tail.size() - spec.stderr_limit);
  }
  if (WIFEXITED(status)) {
    r.exited = true;
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.term_signal = WTERMSIG(status);
  }
  return r;
}

std::string KeptStderr(const ProcessResult& r) {
  // The tail covers bytes [tail_begin, stderr_bytes); the head [0, head.size()).
  const uint64_t tail_begin = r.stderr_bytes - std::min<uint64_t>(r.stderr_bytes, r.stderr_tail.size());
  if (r.stderr_head.empty()) return r.stderr_tail;
  if (tail_begin <= r.stderr_head.size()) {
    const size_t overlap = static_cast<size_t>(r.stderr_head.size() - tail_begin);
    return r.stderr_head + r.stderr_tail.substr(std::min(overlap, r.stderr_tail.size()));
  }
  return absl::StrCat(r.stderr_head, "\n[... ", tail_begin - r.stderr_head.size(), " bytes ...]\n", r.stderr_tail);
}

absl::StatusOr<std::vector<std::string>> SplitCommandLine(std::string_view line) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(cur));
      cur.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const size_t close = line.find('\'', i + 1);
      if (close == std::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("unterminated ' in command line: ", std::string(line)));
      }
      cur.append(line.substr(i + 1, close - i - 1));
      i = close;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size() &&
            (line[j + 1] == '"' || line[j + 1] == '\\' || line[j + 1] == '$' || line[j + 1] == '`')) {
          ++j;
        }
        cur += line[j];
      }
      if (j >= line.size()) {
        return absl::InvalidArgumentError(absl::StrCat("unterminated \" in command line: ", std::string(line)));
      }
      i = j;
    } else if (c == '\\') {
      if (i + 1 < line.size()) cur += line[++i];
    } else {
      cur += c;
    }
  }
  if (in_word) words.push_back(std::move(cur));
  return words;
}

std::string ShellQuote(std::string_view word) {
  if (word.empty()) return "''";
  bool plain = true;
  for (char c : word) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.' || c == '/' || c == ':' || c == '=' || c == ',' || c == '+' || c == '@' ||
                    c == '%';
    if (!ok) plain = false;
  }
  if (plain) return std::string(word);
  std::string out = "'";
  for (char c : word) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& w : argv) {
    if (!out.empty()) out += ' ';
    out += ShellQuote(w);
  }
  return out;
}

}  // namespace crashreplay::bisect
