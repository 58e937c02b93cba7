package testenv

import (
	"os/exec"
	"syscall"
)

// DieWithTest makes cmd's process get SIGKILL when the test process that
// started it dies, so that a test killed before its cleanups ran (a
// timeout, a SIGKILL) leaves no private server behind.
func DieWithTest(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return cmd
}
