/*
 * A plain TCP program for the rsocket interop runs (tests/guest/rsocket_interop.sh): ordinary
 * BSD sockets only, run under LD_PRELOAD=librspreload.so so that rsockets carry it.
 *
 *   tcp_echo server ADDR PORT              echo one connection to its end, then close
 *   tcp_echo client ADDR PORT TOTAL CHUNK  send TOTAL bytes of a counter (mod 256) in CHUNKs,
 *                                          reading each chunk back and checking every byte
 *
 * Prints one line and exits 0 on success.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int write_all(int fd, const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w <= 0) {
			perror("write");
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, unsigned char *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);
		if (r <= 0) {
			if (r < 0)
				perror("read");
			else
				fprintf(stderr, "read: early end of stream\n");
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in sin;
	unsigned char *buf;
	int fd;

	if (argc < 4) {
		fprintf(stderr, "usage: tcp_echo server|client ADDR PORT [TOTAL CHUNK]\n");
		return 2;
	}
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((unsigned short)atoi(argv[3]));
	if (inet_pton(AF_INET, argv[2], &sin.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", argv[2]);
		return 2;
	}
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0) {
		perror("socket");
		return 1;
	}
	if (!strcmp(argv[1], "server")) {
		long long echoed = 0;
		int one = 1, c;

		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) || listen(fd, 1)) {
			perror("bind/listen");
			return 1;
		}
		printf("listening\n");
		fflush(stdout);
		c = accept(fd, NULL, NULL);
		if (c < 0) {
			perror("accept");
			return 1;
		}
		buf = malloc(65536);
		for (;;) {
			ssize_t r = read(c, buf, 65536);
			if (r < 0) {
				perror("read");
				return 1;
			}
			if (r == 0)
				break;
			if (write_all(c, buf, (size_t)r))
				return 1;
			echoed += r;
		}
		shutdown(c, SHUT_WR);
		close(c);
		close(fd);
		printf("tcp_echo server: echoed %lld bytes\n", echoed);
		return 0;
	}
	if (!strcmp(argv[1], "client") && argc == 6) {
		long long total = atoll(argv[4]), left, done = 0;
		size_t chunk = (size_t)atol(argv[5]);
		unsigned char out = 0, in = 0, *back;

		if (connect(fd, (struct sockaddr *)&sin, sizeof(sin))) {
			perror("connect");
			return 1;
		}
		buf = malloc(chunk);
		back = malloc(chunk);
		for (left = total; left > 0;) {
			size_t n = left < (long long)chunk ? (size_t)left : chunk, i;

			for (i = 0; i < n; i++)
				buf[i] = out++;
			if (write_all(fd, buf, n) || read_all(fd, back, n))
				return 1;
			for (i = 0; i < n; i++, done++) {
				if (back[i] != in++) {
					fprintf(stderr, "byte %lld is %#x, not %#x\n", done, back[i],
						(unsigned char)(in - 1));
					return 1;
				}
			}
			left -= (long long)n;
		}
		shutdown(fd, SHUT_WR);
		if (read(fd, buf, 1) != 0) {
			fprintf(stderr, "data after the echo\n");
			return 1;
		}
		close(fd);
		printf("tcp_echo client: %lld bytes echoed and checked\n", done);
		return 0;
	}
	fprintf(stderr, "usage: tcp_echo server|client ADDR PORT [TOTAL CHUNK]\n");
	return 2;
}
