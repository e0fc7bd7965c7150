package peer

import "syscall"

// errTooManyFiles is the accept error of a process out of descriptors.
func errTooManyFiles() error { return syscall.EMFILE }
