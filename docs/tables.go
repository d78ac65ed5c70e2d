package docs

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// nameRow is a table row whose first cell is one `name`.
var nameRow = regexp.MustCompile("(?m)^\\| `([a-z0-9]+)` \\|")

// TableNames reads the Markdown page at path and returns the names in the
// first cell of the table rows of its section headed "## "+heading (up to
// the next "## " heading): how the tests of the code that sends CloudEvents
// attributes compare what it sends with the tables these pages document.
func TableNames(path, heading string) (map[string]bool, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := string(text)
	start := strings.Index(s, "\n## "+heading+"\n")
	if start < 0 {
		return nil, fmt.Errorf("%s has no section %q", path, heading)
	}
	section := s[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	out := map[string]bool{}
	for _, m := range nameRow.FindAllStringSubmatch(section, -1) {
		out[m[1]] = true
	}
	return out, nil
}
