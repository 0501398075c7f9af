/*
 * slow-fsync.c — an LD_PRELOAD shim that makes fsync and fdatasync take FSYNC_DELAY_US microseconds
 * longer, to benchmark against a disk slower than the machine's (docs/benchmarks.md, "slow disk").
 * PostgreSQL flushes WAL holding WALWriteLock, so the delay serializes flushes as a slow disk does,
 * and commits that wait meanwhile share the next flush.
 *
 *   gcc -shared -fPIC -O2 -o slow-fsync.so scripts/slow-fsync.c -ldl
 *   LD_PRELOAD=$PWD/slow-fsync.so FSYNC_DELAY_US=3000 pg_ctl -D <throwaway cluster> -o '-p 55441' start
 *   TEST_DATABASE_URL=postgres://postgres@127.0.0.1:55441/postgres?sslmode=disable scripts/bench-ingest.sh
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static int delay_us(void) {
	static int d = -1;
	if (d < 0) {
		const char *s = getenv("FSYNC_DELAY_US");
		d = s ? atoi(s) : 0;
	}
	return d;
}

int fdatasync(int fd) {
	static int (*real)(int);
	if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
	if (delay_us() > 0) usleep(delay_us());
	return real(fd);
}

int fsync(int fd) {
	static int (*real)(int);
	if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
	if (delay_us() > 0) usleep(delay_us());
	return real(fd);
}
