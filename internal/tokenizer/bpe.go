package tokenizer

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unicode/utf8"
)

// maxCachedWord is the longest word (in bytes) the per-word cache keeps, as tokenizers' BPE cache.
const maxCachedWord = 256

// wordCacheCapacity bounds the number of cached words.
const wordCacheCapacity = 1 << 16

// bpeModel is tokenizers' BPE model: a word's characters (bytes when the pre-tokenizer is
// ByteLevel) start as vocabulary ids and adjacent pairs are merged lowest rank first, leftmost
// first among equal ranks.
type bpeModel struct {
	vocab  map[string]int32
	tokens []string         // id → token when ids are dense; "" where no token has that id
	sparse map[int32]string // id → token when they are not
	maxID  int32            // largest id, -1 for an empty vocabulary
	merges *mergeTable      // pairKey(left, right) → rank<<32 | merged id

	unkID        int32 // -1: no unk_token (unknown characters are dropped, as tokenizers does)
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix

	byteLevel   bool
	byteIDs     [4][256]int32 // byte-level: id of byte b's rune [+prefix (bit 0)] [+suffix (bit 1)], -1 when absent
	fallbackIDs [256]int32    // id of "<0xXX>", -1 when absent

	cache wordCache
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

type bpeOptions struct {
	unkToken     *string
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string
	suffix       string
}

// newBPE builds the model. merges are in rank order; every merge's two sides and their
// concatenation (the right side less the continuing prefix) must be in the vocabulary.
func newBPE(vocab map[string]int32, merges [][2]string, o bpeOptions) (*bpeModel, error) {
	m := &bpeModel{
		vocab:        vocab,
		unkID:        -1,
		fuseUnk:      o.fuseUnk,
		byteFallback: o.byteFallback,
		ignoreMerges: o.ignoreMerges,
		prefix:       o.prefix,
		suffix:       o.suffix,
	}
	m.maxID = -1
	for tok, id := range vocab {
		if id < 0 {
			return nil, fmt.Errorf("vocab: token %q has negative id %d", tok, id)
		}
		m.maxID = max(m.maxID, id)
	}
	if int(m.maxID) < 2*len(vocab)+1024 {
		m.tokens = make([]string, m.maxID+1)
		for tok, id := range vocab {
			m.tokens[id] = tok
		}
	} else {
		m.sparse = make(map[int32]string, len(vocab))
		for tok, id := range vocab {
			m.sparse[id] = tok
		}
	}
	if o.unkToken != nil {
		id, ok := vocab[*o.unkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", *o.unkToken)
		}
		m.unkID = id
	}
	resolved, err := m.resolveMerges(merges)
	if err != nil {
		return nil, err
	}
	m.merges = newMergeTable(len(merges))
	for rank, r := range resolved {
		// A pair listed twice keeps its last rank, as tokenizers' map building does.
		m.merges.put(pairKey(r[0], r[1]), uint64(rank)<<32|uint64(uint32(r[2])))
	}
	for b := range 256 {
		m.fallbackIDs[b] = m.lookup(fmt.Sprintf("<0x%02X>", b))
	}
	return m, nil
}

// token returns the vocabulary entry with this id.
func (m *bpeModel) token(id int32) (string, bool) {
	if m.sparse != nil {
		tok, ok := m.sparse[id]
		return tok, ok
	}
	if id >= 0 && int(id) < len(m.tokens) && m.tokens[id] != "" {
		return m.tokens[id], true
	}
	return "", false
}

func (m *bpeModel) lookup(tok string) int32 {
	if id, ok := m.vocab[tok]; ok {
		return id
	}
	return -1
}

// setByteLevel makes the model read words as bytes spelled in the byte-level alphabet.
func (m *bpeModel) setByteLevel() {
	m.byteLevel = true
	for b := range 256 {
		ch := byteString[b]
		m.byteIDs[0][b] = m.lookup(ch)
		m.byteIDs[1][b] = m.lookup(m.prefix + ch)
		m.byteIDs[2][b] = m.lookup(ch + m.suffix)
		m.byteIDs[3][b] = m.lookup(m.prefix + ch + m.suffix)
	}
}

type symbol struct {
	id         int32
	prev, next int32
	size       int32 // bytes covered; 0 once merged into its left neighbour
}

// scratch holds per-call buffers.
type scratch struct {
	syms []symbol
	heap mergeHeap
	buf  []byte
}

var scratchPool = sync.Pool{New: func() any { return &scratch{} }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

func putScratch(sc *scratch) {
	if cap(sc.syms) > 1<<16 || cap(sc.heap) > 1<<16 || cap(sc.buf) > 1<<16 {
		return // do not keep the buffers of a huge word
	}
	scratchPool.Put(sc)
}

// resolveMerges turns each merge into (left id, right id, merged id). The vocabulary is only read,
// so chunks are resolved in parallel (a Llama 3 file has 280k merges, 840k lookups).
func (m *bpeModel) resolveMerges(merges [][2]string) ([][3]int32, error) {
	out := make([][3]int32, len(merges))
	workers := min(runtime.GOMAXPROCS(0), 8, len(merges)/4096+1)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	chunk := (len(merges) + workers - 1) / workers
	for w := range workers {
		lo, hi := w*chunk, min((w+1)*chunk, len(merges))
		wg.Go(func() { errs[w] = m.resolveRange(merges, out, lo, hi) })
	}
	wg.Wait()
	for _, err := range errs { // the first failing chunk has the lowest ranks
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (m *bpeModel) resolveRange(merges [][2]string, out [][3]int32, lo, hi int) error {
	buf := make([]byte, 0, 64)
	for rank := lo; rank < hi; rank++ {
		mg := merges[rank]
		a, okA := m.vocab[mg[0]]
		b, okB := m.vocab[mg[1]]
		if !okA || !okB {
			missing := mg[0]
			if okA {
				missing = mg[1]
			}
			return fmt.Errorf("merge %d (%q %q): token %q is not in the vocabulary", rank, mg[0], mg[1], missing)
		}
		right := mg[1]
		if len(m.prefix) > 0 {
			if !strings.HasPrefix(right, m.prefix) {
				return fmt.Errorf("merge %d (%q %q): right side lacks the continuing prefix %q", rank, mg[0], mg[1], m.prefix)
			}
			right = right[len(m.prefix):]
		}
		buf = append(append(buf[:0], mg[0]...), right...)
		id, ok := m.vocab[string(buf)]
		if !ok {
			return fmt.Errorf("merge %d (%q %q): merged token %q is not in the vocabulary", rank, mg[0], mg[1], buf)
		}
		out[rank] = [3]int32{a, b, id}
	}
	return nil
}

// tokenize appends the ids of word w to out.
func (m *bpeModel) tokenize(w string, out []int32, sc *scratch) []int32 {
	if w == "" {
		return out
	}
	if m.ignoreMerges {
		var id int32 = -1
		if m.byteLevel {
			sc.buf = appendByteLevel(sc.buf[:0], w)
			if v, ok := m.vocab[string(sc.buf)]; ok {
				id = v
			}
		} else if v, ok := m.vocab[w]; ok {
			id = v
		}
		if id >= 0 {
			return append(out, id)
		}
	}
	if ids, ok := m.cache.get(w); ok {
		return append(out, ids...)
	}
	syms := m.initSymbols(w, sc)
	m.mergeAll(syms, sc)
	start := len(out)
	if len(syms) > 0 {
		for i := int32(0); i >= 0; i = syms[i].next {
			out = append(out, syms[i].id)
		}
	}
	if len(w) < maxCachedWord {
		m.cache.put(w, out[start:])
	}
	return out
}

// initSymbols lays out the word's characters as symbols (tokenizers' BPE::merge_word).
func (m *bpeModel) initSymbols(w string, sc *scratch) []symbol {
	syms := sc.syms[:0]
	if cap(syms) < len(w) {
		syms = make([]symbol, 0, len(w)) // at most one symbol per byte
	}
	add := func(id int32, size int) {
		n := int32(len(syms))
		if n > 0 {
			syms[n-1].next = n
		}
		syms = append(syms, symbol{id: id, prev: n - 1, next: -1, size: int32(size)})
	}
	unkPending, unkLen := false, 0
	unknown := func(tok string, size int) {
		if m.byteFallback {
			ok := true
			for i := 0; i < len(tok); i++ {
				if m.fallbackIDs[tok[i]] < 0 {
					ok = false
					break
				}
			}
			if ok {
				// tokenizers adds the byte tokens without flushing a pending unk first.
				for i := 0; i < len(tok); i++ {
					add(m.fallbackIDs[tok[i]], 1)
				}
				return
			}
		}
		if m.unkID < 0 {
			return
		}
		switch {
		case unkPending && m.fuseUnk:
			unkLen += size
		case unkPending:
			add(m.unkID, unkLen)
			unkLen = size
		default:
			unkPending, unkLen = true, size
		}
	}
	known := func(id int32, size int) {
		if unkPending {
			add(m.unkID, unkLen)
			unkPending = false
		}
		add(id, size)
	}
	if m.byteLevel {
		last := len(w) - 1
		for i := 0; i < len(w); i++ {
			k := 0
			if i > 0 {
				k |= 1
			}
			if i == last {
				k |= 2
			}
			if id := m.byteIDs[k][w[i]]; id >= 0 {
				known(id, 1)
				continue
			}
			tok := byteString[w[i]]
			if k&1 != 0 {
				tok = m.prefix + tok
			}
			if k&2 != 0 {
				tok += m.suffix
			}
			unknown(tok, 1)
		}
	} else {
		for i := 0; i < len(w); {
			_, n := utf8.DecodeRuneInString(w[i:])
			tok := w[i : i+n]
			if i > 0 && m.prefix != "" {
				tok = m.prefix + tok
			}
			if i+n == len(w) && m.suffix != "" {
				tok += m.suffix
			}
			if id, ok := m.vocab[tok]; ok {
				known(id, n)
			} else {
				unknown(tok, n)
			}
			i += n
		}
	}
	if unkPending {
		add(m.unkID, unkLen)
	}
	sc.syms = syms
	return syms
}

// pairMerge returns the rank and merged id of the pair (a, b).
func (m *bpeModel) pairMerge(a, b int32) (rank uint32, newID int32, ok bool) {
	v, ok := m.merges.get(pairKey(a, b))
	return uint32(v >> 32), int32(uint32(v)), ok
}

// mergeAll merges pairs lowest rank first, leftmost first (tokenizers' Word::merge_all: a heap of
// candidate pairs; an entry whose pair changed since it was queued is skipped). A heap entry is
// rank<<32 | position. tokenizers checks that an entry is current by its merged id; checking the
// rank is the same test, since a rank names one merge rule and the pair at a position only changes
// by growing.
func (m *bpeModel) mergeAll(syms []symbol, sc *scratch) {
	h := sc.heap[:0]
	if cap(h) < len(syms) {
		h = make(mergeHeap, 0, len(syms)+len(syms)/2)
	}
	for i := 0; i+1 < len(syms); i++ {
		if rank, _, ok := m.pairMerge(syms[i].id, syms[i+1].id); ok {
			h = append(h, uint64(rank)<<32|uint64(i))
		}
	}
	h.init()
	for len(h) > 0 {
		top := h.pop()
		rank, pos := uint32(top>>32), int32(uint32(top))
		s := &syms[pos]
		if s.size == 0 || s.next < 0 {
			continue
		}
		nx := s.next
		right := syms[nx]
		curRank, newID, ok := m.pairMerge(s.id, right.id)
		if !ok || curRank != rank {
			continue
		}
		s.id = newID
		s.size += right.size
		s.next = right.next
		syms[nx].size = 0
		if right.next >= 0 {
			syms[right.next].prev = pos
		}
		if s.prev >= 0 {
			if r, _, ok := m.pairMerge(syms[s.prev].id, s.id); ok {
				h.push(uint64(r)<<32 | uint64(s.prev))
			}
		}
		if s.next >= 0 {
			if r, _, ok := m.pairMerge(s.id, syms[s.next].id); ok {
				h.push(uint64(r)<<32 | uint64(pos))
			}
		}
	}
	sc.heap = h
}

// mergeHeap is a 4-ary min-heap of rank<<32 | position.
type mergeHeap []uint64

func (h mergeHeap) init() {
	if len(h) < 2 {
		return
	}
	for i := (len(h) - 2) / 4; i >= 0; i-- {
		h.down(i)
	}
}

func (h mergeHeap) down(i int) {
	n := len(h)
	x := h[i]
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for j := c + 1; j < min(c+4, n); j++ {
			if h[j] < h[m] {
				m = j
			}
		}
		if h[m] >= x {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = x
}

func (h *mergeHeap) push(v uint64) {
	*h = append(*h, v)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 4
		if s[p] <= v {
			break
		}
		s[i] = s[p]
		i = p
	}
	s[i] = v
}

func (h *mergeHeap) pop() uint64 {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	*h = s[:last]
	if last > 0 {
		h.down(0)
	}
	return top
}

// wordCache maps words to their ids; it stops growing at wordCacheCapacity.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int32
}

func (c *wordCache) get(w string) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.m[w]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string][]int32)
	}
	if len(c.m) >= wordCacheCapacity {
		return
	}
	if _, ok := c.m[w]; ok {
		return
	}
	c.m[strings.Clone(w)] = append([]int32(nil), ids...)
}

// reset empties the cache.
func (c *wordCache) reset() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
}
