//go:build !linux

package natstest

import "syscall"

// procAttr has no parent-death signal outside Linux; t.Cleanup still kills
// the servers of a test that ends normally.
func procAttr() *syscall.SysProcAttr { return nil }
