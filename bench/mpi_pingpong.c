/*
 * MPI ping-pong between ranks 0 and 1: the reference that bench/vs-mpi.sh
 * compares `lazarus bench pingpong` against.
 *
 * Sizes are the powers of two from 1 B to MAX_BYTES (default 4 MiB, the same
 * sizes as Lazarus's pingpong app). Each trial measures every size once:
 * a barrier, a warm-up of a tenth of the round trips (at least 2), then the
 * timed round trips. Round trips per size scale with the size (many for small
 * messages, fewer for large ones; see round_trips()). One-way latency is half
 * the round-trip time, bandwidth is size / one-way latency, as in Lazarus.
 * Each size's figure is the median over the trials.
 *
 * As NetPIPE (and the NetPIPE loop of Lazarus's pingpong app), each of ranks
 * 0 and 1 sends its own buffer and receives into another, so both sides pay
 * only the library's cost. Each payload is a pattern; each side checks the
 * last one it received.
 *
 * Usage: mpiexec -n 2 mpi_pingpong [TRIALS [MAX_BYTES [SCALE]]]
 *   TRIALS    trials per size (default 5)
 *   MAX_BYTES largest message (default 4194304)
 *   SCALE     multiplies the round trips per size (default 1.0)
 *
 * Output: one JSON object on stdout (rank 0 only). Ranks beyond 1 only take
 * part in the barriers.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG 7

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (mean of the middle two for an even n); sorts v. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/* Round trips for one size: 64 MiB of payload each way, between 50 and 10000
 * round trips, times SCALE (at least 10). */
static long round_trips(size_t size, double scale) {
    long n = (long)((64UL << 20) / size);
    if (n < 50) n = 50;
    if (n > 10000) n = 10000;
    n = (long)(n * scale);
    return n < 10 ? 10 : n;
}

/* Prints s as a JSON string. */
static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c == '\t') printf("\\t");
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int trials = argc > 1 ? atoi(argv[1]) : 5;
    size_t max_bytes = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : (4UL << 20);
    double scale = argc > 3 ? atof(argv[3]) : 1.0;
    if (nranks < 2 || trials < 1 || max_bytes < 1 || !(scale > 0)) {
        if (rank == 0)
            fprintf(stderr, "usage: mpiexec -n 2 %s [TRIALS>=1 [MAX_BYTES>=1 [SCALE>0]]] "
                            "(needs at least 2 ranks)\n", argv[0]);
        MPI_Finalize();
        return 2;
    }

    int nsizes = 0;
    for (size_t s = 1;; s *= 2) {
        nsizes++;
        if (s >= max_bytes) break;
    }
    size_t *sizes = malloc(nsizes * sizeof *sizes);
    for (int i = 0; i < nsizes; i++) {
        size_t s = (size_t)1 << i;
        sizes[i] = s < max_bytes ? s : max_bytes;
    }
    unsigned char *sbuf = malloc(max_bytes);
    unsigned char *rbuf = malloc(max_bytes);
    unsigned char *expect = malloc(max_bytes);
    double *lat = malloc((size_t)nsizes * trials * sizeof *lat); /* [size][trial], seconds */
    int intact = 1;

    for (int t = 0; t < trials; t++) {
        for (int i = 0; i < nsizes; i++) {
            size_t size = sizes[i];
            long reps = round_trips(size, scale);
            long warm = reps / 10 < 2 ? 2 : reps / 10;
            /* Rank r sends pattern seed + r; the peer expects it. */
            size_t seed = (size_t)(t * 31 + i) * 2;
            if (rank < 2)
                for (size_t k = 0; k < size; k++) {
                    sbuf[k] = (unsigned char)((k * 131) ^ (seed + (size_t)rank));
                    expect[k] = (unsigned char)((k * 131) ^ (seed + (size_t)(1 - rank)));
                }
            MPI_Barrier(MPI_COMM_WORLD);
            if (rank == 0) {
                double t0 = 0;
                for (long r = -warm; r < reps; r++) {
                    if (r == 0) t0 = MPI_Wtime();
                    MPI_Send(sbuf, (int)size, MPI_BYTE, 1, TAG, MPI_COMM_WORLD);
                    MPI_Recv(rbuf, (int)size, MPI_BYTE, 1, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                }
                double dt = MPI_Wtime() - t0;
                lat[i * trials + t] = dt / (2.0 * (double)reps);
            } else if (rank == 1) {
                for (long r = -warm; r < reps; r++) {
                    MPI_Recv(rbuf, (int)size, MPI_BYTE, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(sbuf, (int)size, MPI_BYTE, 0, TAG, MPI_COMM_WORLD);
                }
            }
            if (rank < 2) intact &= memcmp(rbuf, expect, size) == 0;
        }
    }

    /* Intact only if both sides got what the other sent. */
    MPI_Allreduce(MPI_IN_PLACE, &intact, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        version[len < MPI_MAX_LIBRARY_VERSION_STRING ? len : MPI_MAX_LIBRARY_VERSION_STRING - 1] = 0;
        char *nl = strchr(version, '\n'); /* first line is enough */
        if (nl) *nl = 0;
        printf("{\"impl\":\"mpi\",\"library\":");
        json_string(version);
        printf(",\"ranks\":%d,\"trials\":%d,\"scale\":%g,\"intact\":%s,\"points\":[",
               nranks, trials, scale, intact ? "true" : "false");
        for (int i = 0; i < nsizes; i++) {
            double *v = &lat[i * trials];
            printf("%s\n {\"bytes\":%zu,\"round_trips\":%ld,\"latency_us_trials\":[",
                   i ? "," : "", sizes[i], round_trips(sizes[i], scale));
            for (int t = 0; t < trials; t++) printf("%s%.4f", t ? "," : "", v[t] * 1e6);
            double m = median(v, trials); /* sorts v: print the trials first */
            printf("],\"latency_us\":%.4f,\"bandwidth_mb_s\":%.2f,\"bandwidth_gb_s\":%.4f}",
                   m * 1e6, (double)sizes[i] / m / 1e6, (double)sizes[i] / m / 1e9);
        }
        printf("\n]}\n");
    }
    free(sizes);
    free(sbuf);
    free(rbuf);
    free(expect);
    free(lat);
    MPI_Finalize();
    return intact ? 0 : 1;
}
