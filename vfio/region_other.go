//go:build !linux

package vfio

func (*Device) ReadRegion(info RegionInfo, off int64, p []byte) error  { return errNoVFIO }
func (*Device) WriteRegion(info RegionInfo, off int64, p []byte) error { return errNoVFIO }
