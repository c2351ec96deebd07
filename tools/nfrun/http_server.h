// An httplib::Server that a client cannot hold or take down.
//
// cpp-httplib (Debian's 0.11) gives each connection a worker thread and
// bounds only each single read (5 s), so a client sending a byte every few
// seconds holds a worker for ever (slowloris), and its listen backlog is 5.
// This server runs its connections itself (the keep-alive loop of httplib's
// own, over its protected process_request) on a stream that gives each
// request's headers and body one deadline, re-listens with a full backlog,
// and tells handlers whether their client is still connected, so that a
// request whose client went away stops generating.
#pragma once

#include <httplib.h>

#include <chrono>

namespace nfrun {

struct HttpLimits {
  /// Seconds a client has to send one request's headers and body.
  std::chrono::milliseconds requestReadTimeout{30000};
  /// Seconds one read or write may wait.
  std::chrono::milliseconds ioTimeout{5000};
  /// Seconds an idle keep-alive connection is kept.
  std::chrono::milliseconds keepAliveTimeout{5000};
  /// Largest request body (413 beyond).
  size_t maxBodyBytes = 8 << 20;
};

class HttpServer : public httplib::Server {
public:
  explicit HttpServer(const HttpLimits &limits);

  /// bind_to_port, then the listen backlog raised to the system's maximum.
  bool bind(const std::string &host, int port);

  /// Whether the client of the request the calling handler thread serves
  /// has closed its connection (or reset it).
  static bool clientGone();

private:
  bool process_and_close_socket(socket_t sock) override;

  HttpLimits limits_;
};

} // namespace nfrun
