// estargz-check reads an eStargz or zstd:chunked blob with the stargz snapshotter's own
// library (Debian's golang-github-containerd-stargz-snapshotter-dev) as the snapshotter does
// before it mounts a layer: the footer, the TOC checked against the digest the layer's descriptor gives, then
// every chunk of every regular file read through the reader and checked by its verifier. It
// also inflates the whole blob (gzip or zstd, by its magic), as a runtime that unpacks the
// layer does, for the diff ID and the uncompressed size.
//
// usage: estargz-check BLOB TOC-DIGEST
// prints: OK files=N chunks=N landmark=NAME prefetch=BYTES diffID=sha256:HEX uncompressed=N
// and exits 1 naming the first check that failed.
package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/containerd/stargz-snapshotter/estargz/zstdchunked"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
)

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", step, err)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: estargz-check BLOB TOC-DIGEST")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fail("open", err)
	}
	st, err := f.Stat()
	if err != nil {
		fail("stat", err)
	}
	want, err := digest.Parse(os.Args[2])
	if err != nil {
		fail("TOC digest", err)
	}
	// The decompressors the snapshotter's layer resolver gives Open (fs/layer/layer.go).
	r, err := estargz.Open(io.NewSectionReader(f, 0, st.Size()),
		estargz.WithDecompressors(new(zstdchunked.Decompressor)))
	if err != nil {
		fail("Open", err)
	}
	verifiers, err := r.VerifyTOC(want)
	if err != nil {
		fail("VerifyTOC", err)
	}
	// The prefetch as the snapshotter's layer.go takes it: the blob up to the offset of the
	// .prefetch.landmark entry's payload, nothing for .no.prefetch.landmark.
	landmark, prefetch := "none", int64(0)
	for _, name := range []string{estargz.PrefetchLandmark, estargz.NoPrefetchLandmark} {
		if e, ok := r.Lookup(name); ok {
			landmark = name
			if name == estargz.PrefetchLandmark {
				prefetch = e.Offset
			}
		}
	}
	files, chunks := 0, 0
	var walk func(dir string, e *estargz.TOCEntry)
	walk = func(dir string, e *estargz.TOCEntry) {
		e.ForeachChild(func(base string, ent *estargz.TOCEntry) bool {
			name := path.Join(dir, base)
			if ent.Type == "dir" {
				walk(name, ent)
				return true
			}
			if ent.Type != "reg" || ent.Size == 0 {
				return true
			}
			files++
			file, err := r.OpenFile(name)
			if err != nil {
				fail("OpenFile "+name, err)
			}
			for off := int64(0); off < ent.Size; {
				ce, ok := r.ChunkEntryForOffset(name, off)
				if !ok {
					fail("chunks", fmt.Errorf("%s: no chunk holds offset %d", name, off))
				}
				size := ce.ChunkSize
				if size == 0 || ce.ChunkOffset+size > ent.Size {
					size = ent.Size - ce.ChunkOffset
				}
				data := make([]byte, size)
				if _, err := file.ReadAt(data, ce.ChunkOffset); err != nil && err != io.EOF {
					fail("read "+name, err)
				}
				v, err := verifiers.Verifier(ce)
				if err != nil {
					fail("verifier "+name, err)
				}
				v.Write(data)
				if !v.Verified() {
					fail("chunk", fmt.Errorf("chunk digest mismatch %s chunkOffset=%d", name, ce.ChunkOffset))
				}
				chunks++
				off = ce.ChunkOffset + size
			}
			return true
		})
	}
	root, ok := r.Lookup("")
	if !ok {
		fail("root", fmt.Errorf("no root directory"))
	}
	walk("", root)

	if _, err := f.Seek(0, io.SeekStart); err != nil {
		fail("seek", err)
	}
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil {
		fail("magic", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		fail("seek", err)
	}
	var inflated io.Reader
	if bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		zr, err := zstd.NewReader(f)
		if err != nil {
			fail("unzstd", err)
		}
		defer zr.Close()
		inflated = zr
	} else {
		zr, err := gzip.NewReader(f)
		if err != nil {
			fail("gunzip", err)
		}
		inflated = zr
	}
	h := sha256.New()
	n, err := io.Copy(h, inflated)
	if err != nil {
		fail("inflate", err)
	}
	fmt.Printf("OK files=%d chunks=%d landmark=%s prefetch=%d diffID=sha256:%x uncompressed=%d\n",
		files, chunks, landmark, prefetch, h.Sum(nil), n)
}
