package natstest

import "syscall"

// procAttr makes the kernel kill a server process when the test binary
// that started it dies, so a crashed test leaves no orphan servers.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
