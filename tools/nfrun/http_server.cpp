// nfrun serve's HTTP server (see http_server.h).
#include "http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace nfrun {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// The connection the calling worker thread serves (-1: none).
thread_local int tCurrentSocket = -1;

/// poll() for `events` up to `wait`, retried on EINTR; the revents, 0 on
/// timeout, -1 on error.
int waitFor(int fd, short events, milliseconds wait) {
  pollfd p{fd, events, 0};
  const auto until = Clock::now() + wait;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(until - Clock::now());
    const int n =
        ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n > 0)
      return p.revents;
    if (n == 0)
      return 0;
    if (errno != EINTR)
      return -1;
  }
}

void addressOf(int fd, bool peer, std::string &ip, int &port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int rc =
      peer ? ::getpeername(fd, reinterpret_cast<sockaddr *>(&addr), &len)
           : ::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len);
  ip.clear();
  port = -1;
  if (rc != 0)
    return;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto *a = reinterpret_cast<const sockaddr_in *>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto *a = reinterpret_cast<const sockaddr_in6 *>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    port = ntohs(a->sin6_port);
  }
  ip = text;
}

/// A connection's stream: buffered reads (httplib reads headers a byte at
/// a time) that fail once the current request's deadline has passed, and
/// writes that wait at most the I/O timeout.
class DeadlineStream final : public httplib::Stream {
public:
  DeadlineStream(int fd, const HttpLimits &limits) : fd_(fd), limits_(limits) {}

  /// A new request starts: its headers and body must arrive in time.
  /// A new request starts: its headers and body must arrive in time, and
  /// be at most the body limit and kHeaderBytes in all (httplib bounds only
  /// a Content-Length body: not a chunked one, nor the headers' number).
  void startRequest() {
    deadline_ = Clock::now() + limits_.requestReadTimeout;
    read_ = 0;
  }
  bool hasBuffered() const { return off_ < size_; }

  bool is_readable() const override { return hasBuffered() || waitRead() > 0; }
  bool is_writable() const override {
    const int ev = waitFor(fd_, POLLOUT, limits_.ioTimeout);
    return ev > 0 && (ev & POLLOUT) && !(ev & (POLLERR | POLLNVAL));
  }

  ssize_t read(char *ptr, size_t size) override {
    if (!hasBuffered()) {
      if (waitRead() <= 0)
        return -1;
      ssize_t n;
      do
        n = ::recv(fd_, buf_, sizeof buf_, 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0)
        return n;
      off_ = 0;
      size_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, size_ - off_);
    if (read_ + n > limits_.maxBodyBytes + kHeaderBytes)
      return -1;
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    read_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char *ptr, size_t size) override {
    if (!is_writable())
      return -1;
    ssize_t n;
    do
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string &ip, int &port) const override {
    addressOf(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string &ip, int &port) const override {
    addressOf(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

private:
  /// Waits for input until the I/O timeout or the request's deadline,
  /// whichever comes first; 0 past the deadline.
  int waitRead() const {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now());
    if (left.count() <= 0)
      return 0;
    return waitFor(fd_, POLLIN, std::min(left, limits_.ioTimeout));
  }

  int fd_;
  const HttpLimits &limits_;
  Clock::time_point deadline_ = Clock::now();
  static constexpr size_t kHeaderBytes = 64 << 10;
  char buf_[4096];
  size_t off_ = 0, size_ = 0;
  size_t read_ = 0; // bytes of the current request
};

/// Every body is read as JSON: curl -d and Python's urllib label theirs
/// application/x-www-form-urlencoded, which httplib would parse as a form
/// and refuse beyond 8 KiB (413) whatever --max-body-bytes says.
void acceptAnyBody(httplib::Request &req) {
  auto it = req.headers.find("Content-Type");
  if (it != req.headers.end() &&
      it->second == "application/x-www-form-urlencoded")
    it->second = "application/json";
}

} // namespace

HttpServer::HttpServer(const HttpLimits &limits) : limits_(limits) {
  set_payload_max_length(limits.maxBodyBytes);
  // The Keep-Alive header httplib writes says this timeout.
  set_keep_alive_timeout(std::max<time_t>(
      1,
      std::chrono::duration_cast<std::chrono::seconds>(limits.keepAliveTimeout)
          .count()));
}

bool HttpServer::bind(const std::string &host, int port) {
  if (!bind_to_port(host, port))
    return false;
  // httplib listens with a backlog of 5: a burst of connections beyond it
  // is refused or delayed by SYN retries. listen() again sets the backlog.
  return ::listen(svr_sock_, SOMAXCONN) == 0;
}

bool HttpServer::clientGone() {
  const int fd = tCurrentSocket;
  if (fd < 0)
    return false;
  const int ev = waitFor(fd, POLLIN | POLLRDHUP, milliseconds(0));
  if (ev < 0 || (ev & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)))
    return true;
  if (ev & POLLIN) {
    // Readable: the peer's close (0 bytes) or bytes of a next request.
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 ||
           (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  tCurrentSocket = sock;
  DeadlineStream stream(sock, limits_);
  bool ok = false;
  // httplib's keep-alive loop: up to keep_alive_max_count_ requests, each
  // after at most the keep-alive timeout of idleness, while the server
  // runs (checked every 100 ms so that stop() ends idle connections).
  for (size_t count = keep_alive_max_count_; count > 0; --count) {
    bool ready = stream.hasBuffered();
    for (auto idle = milliseconds(0);
         !ready && idle < limits_.keepAliveTimeout &&
         svr_sock_ != INVALID_SOCKET;
         idle += milliseconds(100)) {
      const int ev = waitFor(sock, POLLIN, milliseconds(100));
      if (ev < 0)
        break;
      ready = ev > 0;
    }
    if (!ready || svr_sock_ == INVALID_SOCKET)
      break;
    stream.startRequest();
    bool closed = false;
    ok = process_request(stream, count == 1, closed, acceptAnyBody);
    if (!ok || closed)
      break;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  tCurrentSocket = -1;
  return ok;
}

} // namespace nfrun
