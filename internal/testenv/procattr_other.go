//go:build !linux

package testenv

import "os/exec"

// DieWithTest returns cmd as it is: only Linux kills a child with its
// parent.
func DieWithTest(cmd *exec.Cmd) *exec.Cmd { return cmd }
