"""The ground floor: I/O that never leaves a half-written output, exit statuses, lock files naming their holder, the
results layout, specs, digests of files and code, the CPU kernel path, provenance and progress bars. Imports nothing of this package above it."""
