package vfio

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMapResourceWC maps a regular file standing in for sysfs
// resource2_wc; without the file the error is ErrNotSupported.
func TestMapResourceWC(t *testing.T) {
	root := t.TempDir()
	const addr = "0000:af:00.0"
	dir := filepath.Join(root, "bus/pci/devices", addr)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	h := Host{SysfsRoot: root}
	_, err := h.MapResourceWC(addr, 2, 8192)
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorContains(t, err, filepath.Join(dir, "resource2_wc"))

	require.NoError(t, os.WriteFile(filepath.Join(dir, "resource2_wc"), make([]byte, 8192), 0o600))
	m, err := h.MapResourceWC(addr, 2, 8192)
	require.NoError(t, err)
	require.Len(t, m.Bytes(), 8192)
	m.Bytes()[8191] = 1
	require.NoError(t, m.Close())
	require.NoError(t, m.Close())
	require.Nil(t, m.Bytes())
}

func TestResourceStart(t *testing.T) {
	root := t.TempDir()
	const addr = "0000:af:00.0"
	dir := filepath.Join(root, "bus/pci/devices", addr)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	resource := "0x000038007ff00000 0x000038007ff0ffff 0x000000000014220c\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x0000380000000000 0x000038003fffffff 0x000000000014220c\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "resource"), []byte(resource), 0o644))
	h := Host{SysfsRoot: root}
	base, err := h.ResourceStart(addr, 2)
	require.NoError(t, err)
	require.Equal(t, uint64(0x380000000000), base)
	_, err = h.ResourceStart(addr, 1)
	require.ErrorIs(t, err, ErrMissingBAR)
}
