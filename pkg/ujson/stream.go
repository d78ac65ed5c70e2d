package ujson

import (
	"io"
)

// Stream cuts a stream of JSON objects and arrays (a Kubernetes watch
// body: one event after another) into one value's bytes at a time, for a
// Reader, so that a decoder of the stream can parse each value once.
//
// It only frames: it follows strings and brackets to find where a value
// ends, and gives up (Next's ok false) on anything else, or anything it
// can tell is malformed, without deciding what is wrong. The caller then
// hands Rest, the stream from the start of that value on, to the decoder
// it stands in for, which reads it exactly as it would have read the
// stream from there: that decoder gives the value, the io.EOF or the
// error the stream deserves.
type Stream struct {
	r   io.Reader
	buf []byte
	// start is where the current value begins, end where the buffered
	// bytes end.
	start, end int
	// next is where the value after the current one begins.
	next int
	// err is the reader's error, kept for Rest to give after the
	// buffered bytes.
	err error
}

// Sizes of a Stream's buffer: it starts at streamBuf, doubles while a
// value does not fit, and is dropped after a value of more than
// streamKeep; a value of more than streamMax is left to the other
// decoder, which has the stream from then on (so this one holds no more).
const (
	streamBuf  = 32 << 10
	streamKeep = 1 << 20
	streamMax  = 64 << 20
)

// NewStream returns a Stream reading r.
func NewStream(r io.Reader) *Stream { return &Stream{r: r} }

// Next returns the bytes of the next value, valid until the next call.
// ok false (at the stream's end too) means the caller must read the
// stream's Rest with another decoder.
func (s *Stream) Next() (value []byte, ok bool) {
	if len(s.buf) > streamKeep && s.end-s.next <= streamBuf {
		// Drop a big value's buffer, keeping what follows it.
		rest := make([]byte, streamBuf)
		s.end = copy(rest, s.buf[s.next:s.end])
		s.buf, s.next = rest, 0
	}
	s.start = s.next
	pos := s.start
	// The value's first byte, after whitespace.
	for {
		if pos == s.end {
			if !s.fill(&pos) {
				return nil, false
			}
			continue
		}
		c := s.buf[pos]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			pos++
			continue
		}
		if c != '{' && c != '[' {
			return nil, false
		}
		break
	}
	// Rest starts here: the whitespace before a value is nothing to a
	// decoder.
	s.start = pos
	depth := 0
	inString := false
	for {
		if pos == s.end {
			if !s.fill(&pos) {
				return nil, false
			}
			continue
		}
		if inString {
			// Up to the closing quote; an escape takes the byte after
			// it (which may be in the next read).
			for pos < s.end {
				c := s.buf[pos]
				if c == '"' {
					inString = false
					pos++
					break
				}
				if c == '\\' {
					if pos+1 == s.end {
						break
					}
					pos += 2
					continue
				}
				if c < 0x20 {
					// Malformed; and a stray quote must not make
					// the rest of the stream one string.
					return nil, false
				}
				pos++
			}
			if inString {
				if !s.fill(&pos) {
					return nil, false
				}
			}
			continue
		}
		c := s.buf[pos]
		pos++
		switch frameClass[c] {
		case frameQuote:
			inString = true
		case frameOpen:
			depth++
		case frameClose:
			if depth--; depth == 0 {
				s.next = pos
				return s.buf[s.start:pos], true
			}
		case frameBad:
			return nil, false
		}
	}
}

// Classes of the bytes outside strings, for Next: frameOther are the
// bytes of whitespace, separators, numbers and literals (the Reader
// checks them); anything else cannot be JSON.
const (
	frameBad = iota
	frameOther
	frameQuote
	frameOpen
	frameClose
)

var frameClass = func() (t [256]byte) {
	for _, c := range []byte(" \t\n\r,:-+.0123456789aeEflnrstu") {
		t[c] = frameOther
	}
	t['"'] = frameQuote
	t['{'], t['['] = frameOpen, frameOpen
	t['}'], t[']'] = frameClose, frameClose
	return t
}()

// fill reads more of the stream after s.end, moving the current value to
// the buffer's start (pos, an index into it, moves along) or growing the
// buffer; false when the reader has nothing more to give, or the value
// is too big.
func (s *Stream) fill(pos *int) bool {
	if s.err != nil {
		return false
	}
	if s.start > 0 && s.end == len(s.buf) {
		n := copy(s.buf, s.buf[s.start:s.end])
		*pos -= s.start
		s.end, s.start = n, 0
	}
	if s.end == len(s.buf) {
		if len(s.buf) >= streamMax {
			return false
		}
		grown := make([]byte, max(streamBuf, 2*len(s.buf)))
		copy(grown, s.buf[:s.end])
		s.buf = grown
	}
	for {
		n, err := s.r.Read(s.buf[s.end:])
		s.end += n
		if err != nil {
			s.err = err
		}
		if n > 0 {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// Rest returns the stream from the start of the value the last Next
// returned (or failed to), for another decoder: the bytes buffered here,
// then the reader's error if it gave one, else the rest of the reader.
// The Stream must not be used after it.
func (s *Stream) Rest() io.Reader {
	return &restReader{buf: s.buf[s.start:s.end], err: s.err, r: s.r}
}

type restReader struct {
	buf []byte
	err error
	r   io.Reader
}

func (rr *restReader) Read(p []byte) (int, error) {
	if len(rr.buf) > 0 {
		n := copy(p, rr.buf)
		rr.buf = rr.buf[n:]
		return n, nil
	}
	if rr.err != nil {
		return 0, rr.err
	}
	return rr.r.Read(p)
}
