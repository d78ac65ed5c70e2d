package bus

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseSuppressEchoes(t *testing.T) {
	type result struct {
		On, Err bool
	}
	cases := []struct {
		reason, in string
		want       result
	}{
		{reason: "absent: upstream's contract", in: "", want: result{}},
		{reason: "true opts in", in: "true", want: result{On: true}},
		{reason: "surrounding space is forgiven", in: " true ", want: result{On: true}},
		{reason: "false opts out", in: "false", want: result{}},
		{reason: "anything else is an error and the default", in: "yes", want: result{Err: true}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			on, err := ParseSuppressEchoes(c.in)
			if diff := cmp.Diff(c.want, result{On: on, Err: err != nil}); diff != "" {
				t.Errorf("ParseSuppressEchoes(%q) (-want +got):\n%s", c.in, diff)
			}
			if got := SuppressesEchoes(map[string]string{SuppressEchoesAnnotation: c.in}); got != c.want.On {
				t.Errorf("SuppressesEchoes = %v, want %v", got, c.want.On)
			}
		})
	}
}
