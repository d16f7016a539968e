package measure

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// helperEnv names what the test binary, run again, does instead of its
// tests: Main and ParseFlags end the process.
const helperEnv = "MEASURE_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "main-ok":
		Main("tool", func(ctx context.Context) error {
			if ctx.Err() != nil {
				return errors.New("context done at the start")
			}
			return nil
		})
		os.Exit(3) // Main returned: run succeeded.
	case "main-fails":
		Main("tool", func(context.Context) error { return errors.New("boom") })
		os.Exit(3)
	default: // "flags": parse the arguments after --.
		fs := pflag.NewFlagSet("tool", pflag.ContinueOnError)
		fs.Int("n", 0, "a number")
		ParseFlags(fs, os.Args[len(os.Args)-1:])
		os.Exit(3)
	}
}

func TestMainAndParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name, mode, arg string
		wantCode        int
		wantStderr      string
	}{
		{"run succeeds: Main returns", "main-ok", "", 3, ""},
		{"run fails: the tool's name and the error, exit 1", "main-fails", "", 1, "tool: boom\n"},
		{"flags parsed: ParseFlags returns", "flags", "--n=1", 3, ""},
		{"help: exit 0", "flags", "--help", 0, "Usage of tool"},
		{"a wrong flag: exit 2, naming the tool and the flag", "flags", "--nope", 2, "tool: unknown flag: --nope\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$", tc.arg)
			cmd.Env = append(os.Environ(), helperEnv+"="+tc.mode)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.wantCode, stderr.String())
			}
			if tc.wantStderr == "" && stderr.Len() > 0 || !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr %q, want %q", stderr.String(), tc.wantStderr)
			}
		})
	}
}
