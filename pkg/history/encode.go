package history

import (
	"strconv"
	"unicode/utf8"
)

// appendRecord appends r as JSON, byte for byte what encoding/json's Marshal
// produces for a Record (the tests hold it to that). Encoding by hand keeps
// Record free of reflection and allocation on the delivery path; the reader
// still uses encoding/json.
func appendRecord(b []byte, r Record) []byte {
	b = append(b, `{"k":`...)
	b = appendString(b, string(r.Kind))
	b = appendStringField(b, `,"u":`, r.Unit)
	b = appendStringField(b, `,"m":`, r.Member)
	b = appendIntField(b, `,"i":`, r.Incarnation)
	b = appendIntField(b, `,"e":`, r.Epoch)
	b = appendIntField(b, `,"te":`, r.TopologyEpoch)
	b = appendStringField(b, `,"r":`, r.RowID)
	if r.StreamSeq != 0 {
		b = strconv.AppendUint(append(b, `,"q":`...), r.StreamSeq, 10)
	}
	if r.NumDelivered != 0 {
		b = strconv.AppendUint(append(b, `,"d":`...), r.NumDelivered, 10)
	}
	b = appendIntField(b, `,"n":`, int64(r.Rows))
	b = appendStringField(b, `,"x":`, r.Detail)
	b = strconv.AppendInt(append(b, `,"s":`...), r.Start, 10)
	b = appendIntField(b, `,"f":`, r.Fetch)
	b = appendIntField(b, `,"t":`, r.End)
	b = appendIntField(b, `,"w":`, r.Wall)
	return append(b, '}')
}

// appendStringField appends key and s unless s is empty (omitempty).
func appendStringField(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendString(append(b, key...), s)
}

// appendIntField appends key and n unless n is zero (omitempty).
func appendIntField(b []byte, key string, n int64) []byte {
	if n == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), n, 10)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string with encoding/json's escaping:
// quote, backslash and control characters, <, > and & (HTML-safe), U+2028
// and U+2029, and each invalid UTF-8 byte as U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			b = appendEscapedByte(b, c)
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(append(b, s[start:i]...), `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(append(b, s[start:i]...), `\u202`...)
			b = append(b, hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendEscapedByte escapes one ASCII byte the way encoding/json does.
func appendEscapedByte(b []byte, c byte) []byte {
	switch c {
	case '\\', '"':
		return append(b, '\\', c)
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	return append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
}
