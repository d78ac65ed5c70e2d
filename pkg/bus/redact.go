package bus

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// redactSecretData returns a parked message's JSON with the values of every
// Secret's data and stringData emptied (their keys, and everything else,
// kept for inspection), and a note saying what was removed ("" if
// nothing). It walks the whole body rather than known fields: a Secret may
// sit among the children, a rolling parent's revisions[].children, a
// decorator's attachments, a status or anything a later field carries.
// A body that does not decode is replaced by an empty object: what it
// carries cannot be told, and the headers still say which parent and stage
// it was.
func redactSecretData(data []byte) ([]byte, string) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // other fields stay as they were
	var body any
	if err := dec.Decode(&body); err != nil {
		return []byte("{}"), "body removed: not a decodable message"
	}
	if dec.More() {
		return []byte("{}"), "body removed: not a decodable message"
	}
	secrets := redactSecrets(body, false)
	if secrets == 0 {
		return data, ""
	}
	out, err := json.Marshal(body)
	if err != nil {
		return []byte("{}"), "body removed: re-encoding the redacted message failed"
	}
	return out, fmt.Sprintf("data and stringData values of %d Secrets", secrets)
}

// redactSecrets empties the data and stringData values of every Secret in
// v and returns how many had any. inSecretList says v is an item of a
// v1 SecretList, whose items may omit apiVersion and kind.
func redactSecrets(v any, inSecretList bool) int {
	n := 0
	switch t := v.(type) {
	case []any:
		for _, e := range t {
			n += redactSecrets(e, inSecretList)
		}
	case map[string]any:
		core := t["apiVersion"] == "v1"
		isSecret := (core && t["kind"] == "Secret") || (inSecretList && t["kind"] == nil && t["apiVersion"] == nil)
		// Only Secrets that carry values count: a reference to one (an
		// applied event's list of children) has nothing to remove.
		if isSecret && (t["data"] != nil || t["stringData"] != nil) {
			n++
			for _, field := range []string{"data", "stringData"} {
				if values, ok := t[field].(map[string]any); ok {
					for k := range values {
						values[k] = ""
					}
				} else if t[field] != nil {
					// Not a map: not a valid Secret, but whatever it is goes.
					t[field] = nil
				}
			}
		}
		list := core && t["kind"] == "SecretList"
		for k, e := range t {
			if list && k == "items" {
				n += redactSecrets(e, true)
				continue
			}
			n += redactSecrets(e, false)
		}
	}
	return n
}
