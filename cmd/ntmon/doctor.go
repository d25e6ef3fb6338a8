package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/doctor"
	"github.com/ntstack/ntstack/internal/tools/cli"
)

// doctorRoot is where `ntmon doctor` finds /sys, /proc and /dev; tests
// point it at a fake tree.
var doctorRoot = "/"

const doctorSynopsis = "[-config FILE] [-socket PATH] [-json]"

// doctorCmd is `ntmon doctor`: it checks the environment and exits 1 if a
// check failed. Without -config it reads the default configuration file
// if there is one, and otherwise skips the live link checks.
func doctorCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.FlagSet("ntmon doctor", doctorSynopsis, stderr)
	cfgPath := fs.String("config", "", "host configuration file (default "+defaultConfig+" if it exists): check its peers and links through ntmon")
	socket := fs.String("socket", "", "ntmon's local API socket (default: under the config's state_dir)")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	cfg, err := loadDoctorConfig(*cfgPath)
	if err != nil {
		fmt.Fprintln(stderr, "ntmon doctor:", err)
		return 1
	}
	rs := doctor.Run(ctx, doctor.Options{Root: doctorRoot, Config: cfg, MonitorSocket: *socket})
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rs)
	} else {
		err = doctor.Write(stdout, rs)
	}
	if err != nil {
		fmt.Fprintln(stderr, "ntmon doctor:", err)
		return 1
	}
	if doctor.Failed(rs) {
		return 1
	}
	return 0
}

// loadDoctorConfig loads path, or the default configuration if path is
// empty and that file exists (nil if it does not).
func loadDoctorConfig(path string) (*config.Config, error) {
	if path == "" {
		if _, err := os.Stat(defaultConfig); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		path = defaultConfig
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	return cfg, nil
}
