// A minimal blocking HTTP/1.1 client for the in-process server tests: one request per connection
// ("Connection: close"), the answer read to the connection's end.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace petrel::test {

struct HttpAnswer {
  int status = -1;  // -1: no answer (refused, cut, unreadable)
  std::string head;
  std::string body;
};

// Undoes chunked transfer coding; the text as it is when it is not chunked.
inline std::string unchunk(const std::string& raw) {
  std::string out;
  size_t at = 0;
  while (at < raw.size()) {
    const size_t eol = raw.find("\r\n", at);
    if (eol == std::string::npos) break;
    const size_t size = std::stoul(raw.substr(at, eol - at), nullptr, 16);
    if (size == 0) break;
    out += raw.substr(eol + 2, size);
    at = eol + 2 + size + 2;
  }
  return out;
}

inline HttpAnswer http_request(int port, const std::string& method, const std::string& path,
                               const std::string& body = "", const std::string& extra_headers = "") {
  HttpAnswer answer;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return answer;
  }
  const std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                              extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string raw;
  char buffer[65536];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) raw.append(buffer, size_t(n));
  ::close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.1 ") != 0 || head_end == std::string::npos) return answer;
  answer.status = std::stoi(raw.substr(9, 3));
  answer.head = raw.substr(0, head_end);
  answer.body = raw.substr(head_end + 4);
  if (answer.head.find("Transfer-Encoding: chunked") != std::string::npos) answer.body = unchunk(answer.body);
  return answer;
}

}  // namespace petrel::test
