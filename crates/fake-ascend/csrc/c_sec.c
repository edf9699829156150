/* A stand-in for one of the CANN runtime's own dependencies (libc_sec.so): the fake runtime
 * needs it at load time, as the real one does, so a loader that cannot find it fails the way
 * it fails on a machine without set_env.sh. */
int fake_c_sec_version(void) { return 1; }
