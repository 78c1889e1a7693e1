package org.flick.interop.hadoop;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.PrintStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;
import java.util.Random;
import java.util.TreeMap;
import java.util.zip.CRC32;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.io.DataInputBuffer;
import org.apache.hadoop.io.IntWritable;
import org.apache.hadoop.io.Text;
import org.apache.hadoop.mapred.IFile;

/**
 * Command-line harness that produces and checks Hadoop IFile streams
 * (Text keys, IntWritable values, no codec) with Hadoop's own
 * {@link IFile.Writer} and {@link IFile.Reader}.
 *
 * <p>Subcommands: generate, verify, merge, dump, inspect. See README.md.
 *
 * <p>Exit codes: 0 ok, 1 verification failure (mismatch, checksum error,
 * malformed file), 2 usage error.
 */
public final class IFileHarness {

    static final int EXIT_OK = 0;
    static final int EXIT_FAIL = 1;
    static final int EXIT_USAGE = 2;

    private IFileHarness() {}

    public static void main(String[] args) {
        // Must run before any Hadoop class creates a logger: point log4j 1.x
        // (reload4j, Hadoop's backend) at our quiet config (ERROR, stderr).
        if (System.getProperty("log4j.configuration") == null) {
            System.setProperty("log4j.configuration", "flick-ifile-log4j.properties");
        }
        int rc;
        try {
            rc = run(args);
        } catch (UsageException e) {
            System.err.println("error: " + e.getMessage());
            System.err.println(USAGE);
            rc = EXIT_USAGE;
        } catch (Exception e) {
            System.err.println("error: " + e);
            rc = EXIT_FAIL;
        }
        System.out.flush();
        System.exit(rc);
    }

    static final String USAGE = String.join("\n",
        "usage: java -jar ifile-harness.jar <command> [options]",
        "  generate --out DIR [--mappers 8] [--words 200000] [--seed 1] [--vocab 3000] [--combine] [--no-text]",
        "      writes DIR/mapper-<i>.ifile (sorted wordcount map output, IFile.Writer),",
        "      DIR/mapper-<i>.txt (the mapper's share of the text), DIR/mapper-<i>.expected.tsv,",
        "      and DIR/expected.tsv (word TAB count over the whole text)",
        "  verify --in FILE --expected TSV [--allow-duplicates]",
        "      reads FILE with IFile.Reader (checks CRC32), checks strictly increasing keys",
        "      and counts against TSV; prints 'records=... words=... total=... ok' or the first mismatch",
        "  merge --out FILE IN...",
        "      reference aggregator: k-way merge of sorted IFiles, summing values of equal keys",
        "  dump --in FILE [--limit N]",
        "      prints 'key<TAB>value' per record (read with IFile.Reader)",
        "  inspect --in FILE [--show 3]",
        "      parses FILE byte by byte WITHOUT Hadoop (documented layout) and checks the",
        "      EOF marker and the big-endian CRC32 trailer; prints the first records in hex");

    static int run(String[] argv) throws Exception {
        if (argv.length == 0 || argv[0].equals("-h") || argv[0].equals("--help") || argv[0].equals("help")) {
            System.out.println(USAGE);
            return argv.length == 0 ? EXIT_USAGE : EXIT_OK;
        }
        Args a = new Args(Arrays.copyOfRange(argv, 1, argv.length));
        switch (argv[0]) {
            case "generate": return generate(a);
            case "verify": return verify(a);
            case "merge": return merge(a);
            case "dump": return dump(a);
            case "inspect": return inspect(a);
            default: throw new UsageException("unknown command: " + argv[0]);
        }
    }

    // ------------------------------------------------------------------ Hadoop plumbing

    static Configuration conf() {
        Configuration conf = new Configuration();
        // Only Writable serialization is needed; avoids probing Avro classes.
        conf.setStrings("io.serializations", "org.apache.hadoop.io.serializer.WritableSerialization");
        return conf;
    }

    /** Raw local file system: no .crc side files. */
    static FileSystem rawFs(Configuration conf) throws IOException {
        RawLocalFileSystem fs = new RawLocalFileSystem();
        fs.initialize(URI.create("file:///"), conf);
        return fs;
    }

    static org.apache.hadoop.fs.Path hpath(Path p) {
        return new org.apache.hadoop.fs.Path(p.toAbsolutePath().toUri());
    }

    static IFile.Writer<Text, IntWritable> openWriter(Configuration conf, FileSystem fs, Path out) throws IOException {
        return new IFile.Writer<>(conf, fs.create(hpath(out), true), Text.class, IntWritable.class,
            /* codec */ null, /* writesCounter */ null, /* ownOutputStream */ true);
    }

    /** Reads Text/IntWritable records from an IFile with Hadoop's IFile.Reader. */
    static final class RecordReader implements AutoCloseable {
        final IFile.Reader<Text, IntWritable> reader;
        final DataInputBuffer keyBuf = new DataInputBuffer();
        final DataInputBuffer valBuf = new DataInputBuffer();
        final long length;
        long records;

        RecordReader(Configuration conf, FileSystem fs, Path in) throws IOException {
            org.apache.hadoop.fs.Path hp = hpath(in);
            length = fs.getFileStatus(hp).getLen();
            FSDataInputStream is = fs.open(hp);
            reader = new IFile.Reader<>(conf, is, length, /* codec */ null, /* readsCounter */ null);
        }

        /** Fills key/value; returns false at the EOF marker. */
        boolean next(Text key, IntWritable value) throws IOException {
            if (!reader.nextRawKey(keyBuf)) {
                return false;
            }
            int kEnd = keyBuf.getLength();
            key.readFields(keyBuf);
            if (keyBuf.getPosition() != kEnd) {
                throw new IOException("record " + records + ": Text key did not consume its IFile key bytes");
            }
            reader.nextRawValue(valBuf);
            int vEnd = valBuf.getLength();
            value.readFields(valBuf);
            if (valBuf.getPosition() != vEnd) {
                throw new IOException("record " + records + ": IntWritable value is not exactly 4 bytes");
            }
            records++;
            return true;
        }

        @Override
        public void close() throws IOException {
            reader.close();
        }
    }

    // ------------------------------------------------------------------ generate

    static int generate(Args a) throws IOException {
        Path outDir = Paths.get(a.required("--out"));
        int mappers = a.intOpt("--mappers", 8);
        int words = a.intOpt("--words", 200_000);
        long seed = a.longOpt("--seed", 1);
        int vocabSize = a.intOpt("--vocab", 3000);
        boolean combine = a.flag("--combine");
        boolean noText = a.flag("--no-text");
        a.noPositional();
        if (mappers < 1 || words < 0 || vocabSize < 3) {
            throw new UsageException("need --mappers >= 1, --words >= 0, --vocab >= 3");
        }
        Files.createDirectories(outDir);
        Random rnd = new Random(seed);

        // Vocabulary: equal thirds of 8-, 12- and 16-letter lowercase words.
        int[] lengths = {8, 12, 16};
        LinkedHashSet<String> vocabSet = new LinkedHashSet<>();
        for (int i = 0; vocabSet.size() < vocabSize; i++) {
            int len = lengths[vocabSet.size() % 3];
            char[] w = new char[len];
            for (int j = 0; j < len; j++) {
                w[j] = (char) ('a' + rnd.nextInt(26));
            }
            vocabSet.add(new String(w));
        }
        String[] vocab = vocabSet.toArray(new String[0]);

        // The text: `words` draws from the vocabulary, skewed (u^2) so counts differ
        // a lot between words, as in natural text.
        String[] text = new String[words];
        for (int i = 0; i < words; i++) {
            double u = rnd.nextDouble();
            text[i] = vocab[(int) (u * u * vocab.length)];
        }

        Configuration conf = conf();
        FileSystem fs = rawFs(conf);
        TreeMap<String, Long> global = new TreeMap<>();
        long totalBytes = 0;
        for (int m = 0; m < mappers; m++) {
            int from = (int) ((long) words * m / mappers);
            int to = (int) ((long) words * (m + 1) / mappers);
            String[] share = Arrays.copyOfRange(text, from, to);

            // Expected counts straight from the text (String keys, no Hadoop types).
            Map<String, Long> local = new HashMap<>();
            for (String w : share) {
                local.merge(w, 1L, Long::sum);
                global.merge(w, 1L, Long::sum);
            }
            writeTsv(outDir.resolve("mapper-" + m + ".expected.tsv"), new TreeMap<>(local));
            if (!noText) {
                writeText(outDir.resolve("mapper-" + m + ".txt"), share);
            }

            // Map output: (word, 1) per occurrence, sorted by Text's raw byte order
            // (stable sort), or combined per mapper with --combine.
            Text[] keys = new Text[share.length];
            for (int i = 0; i < share.length; i++) {
                keys[i] = new Text(share[i]);
            }
            Arrays.sort(keys); // Text.compareTo == raw byte comparison of the UTF-8 bytes
            Path ifile = outDir.resolve("mapper-" + m + ".ifile");
            long records = 0;
            try (Closer<IFile.Writer<Text, IntWritable>> wc = new Closer<>(openWriter(conf, fs, ifile))) {
                IFile.Writer<Text, IntWritable> w = wc.get();
                IntWritable v = new IntWritable();
                int i = 0;
                while (i < keys.length) {
                    if (combine) {
                        int j = i;
                        while (j < keys.length && keys[j].equals(keys[i])) j++;
                        v.set(j - i);
                        w.append(keys[i], v);
                        i = j;
                    } else {
                        v.set(1);
                        w.append(keys[i], v);
                        i++;
                    }
                    records++;
                }
            }
            long size = Files.size(ifile);
            totalBytes += size;
            System.out.printf("%s records=%d distinct=%d bytes=%d%n", ifile, records, local.size(), size);
        }
        Path expected = outDir.resolve("expected.tsv");
        writeTsv(expected, global);
        System.out.printf("%s words=%d distinct=%d (mappers=%d, seed=%d, vocab=%d, %s) ifile-bytes=%d%n",
            expected, words, global.size(), mappers, seed, vocabSize,
            combine ? "combined per mapper" : "one (word,1) record per occurrence", totalBytes);
        return EXIT_OK;
    }

    static void writeTsv(Path p, TreeMap<String, Long> counts) throws IOException {
        // TreeMap<String> order == Text byte order for ASCII words.
        try (BufferedWriter w = Files.newBufferedWriter(p, StandardCharsets.UTF_8)) {
            for (Map.Entry<String, Long> e : counts.entrySet()) {
                w.write(e.getKey());
                w.write('\t');
                w.write(Long.toString(e.getValue()));
                w.write('\n');
            }
        }
    }

    static void writeText(Path p, String[] share) throws IOException {
        try (BufferedWriter w = Files.newBufferedWriter(p, StandardCharsets.UTF_8)) {
            for (int i = 0; i < share.length; i++) {
                w.write(share[i]);
                w.write((i % 10 == 9 || i == share.length - 1) ? '\n' : ' ');
            }
        }
    }

    // ------------------------------------------------------------------ verify

    static int verify(Args a) throws IOException {
        Path in = Paths.get(a.required("--in"));
        Path expectedPath = Paths.get(a.required("--expected"));
        boolean allowDup = a.flag("--allow-duplicates");
        a.noPositional();

        // Expected counts: word -> count, in file order.
        TreeMap<String, Long> expected = new TreeMap<>();
        try (BufferedReader r = Files.newBufferedReader(expectedPath, StandardCharsets.UTF_8)) {
            String line;
            int n = 0;
            while ((line = r.readLine()) != null) {
                n++;
                if (line.isEmpty()) continue;
                int tab = line.indexOf('\t');
                if (tab < 0) throw new IOException(expectedPath + ":" + n + ": no TAB");
                expected.put(line.substring(0, tab), Long.parseLong(line.substring(tab + 1).trim()));
            }
        }

        // Pass 1: read everything with IFile.Reader. The CRC32 trailer is only
        // checked when the reader reaches the end of the data, so read the whole
        // stream before judging content: a checksum error takes precedence.
        List<String> keys = new ArrayList<>();
        List<Text> rawKeys = new ArrayList<>();
        List<Integer> values = new ArrayList<>();
        Configuration conf = conf();
        FileSystem fs = rawFs(conf);
        long length;
        try (RecordReader rr = new RecordReader(conf, fs, in)) {
            length = rr.length;
            Text k = new Text();
            IntWritable v = new IntWritable();
            while (rr.next(k, v)) {
                rawKeys.add(new Text(k));
                keys.add(k.toString());
                values.add(v.get());
            }
        } catch (IOException e) {
            System.out.println("FAIL " + in + ": IFile.Reader error: " + e);
            return EXIT_FAIL;
        }

        // Pass 2: content.
        long records = keys.size();
        long total = 0;
        long distinct = 0;
        int i = 0;
        while (i < keys.size()) {
            if (i > 0) {
                int c = rawKeys.get(i - 1).compareTo(rawKeys.get(i));
                if (c > 0 || (c == 0 && !allowDup)) {
                    System.out.printf("FAIL %s: record %d: key '%s' not strictly greater than previous key '%s'%n",
                        in, i, keys.get(i), keys.get(i - 1));
                    return EXIT_FAIL;
                }
            }
            String key = keys.get(i);
            long sum = values.get(i);
            int j = i + 1;
            if (allowDup) {
                while (j < keys.size() && keys.get(j).equals(key)) {
                    sum += values.get(j);
                    j++;
                }
            }
            Long want = expected.get(key);
            if (want == null) {
                System.out.printf("FAIL %s: record %d: extra word '%s' (count %d) not in %s%n",
                    in, i, key, sum, expectedPath);
                return EXIT_FAIL;
            }
            if (want != sum) {
                System.out.printf("FAIL %s: record %d: word '%s' count %d, expected %d%n", in, i, key, sum, want);
                return EXIT_FAIL;
            }
            // Ordered merge check: every expected word before `key` must have appeared.
            String prevExpected = expected.lowerKey(key);
            if (prevExpected != null && (i == 0 || keys.get(i - 1).compareTo(prevExpected) < 0)) {
                System.out.printf("FAIL %s: missing word '%s' (expected count %d), before record %d '%s'%n",
                    in, prevExpected, expected.get(prevExpected), i, key);
                return EXIT_FAIL;
            }
            total += sum;
            distinct++;
            i = j;
        }
        String lastSeen = keys.isEmpty() ? null : keys.get(keys.size() - 1);
        String missing = lastSeen == null ? (expected.isEmpty() ? null : expected.firstKey()) : expected.higherKey(lastSeen);
        if (missing != null) {
            System.out.printf("FAIL %s: missing word '%s' (expected count %d) after the last record%n",
                in, missing, expected.get(missing));
            return EXIT_FAIL;
        }
        if (distinct != expected.size()) { // cannot happen given the checks above; belt and braces
            System.out.printf("FAIL %s: %d distinct words, expected %d%n", in, distinct, expected.size());
            return EXIT_FAIL;
        }
        System.out.printf("records=%d, words=%d, total=%d, bytes=%d, ok%n", records, distinct, total, length);
        return EXIT_OK;
    }

    // ------------------------------------------------------------------ merge (reference aggregator)

    static final class Source {
        final RecordReader rr;
        final Text key = new Text();
        final IntWritable value = new IntWritable();
        final int index;

        Source(RecordReader rr, int index) {
            this.rr = rr;
            this.index = index;
        }

        boolean advance() throws IOException {
            return rr.next(key, value);
        }
    }

    static int merge(Args a) throws IOException {
        Path out = Paths.get(a.required("--out"));
        List<String> inputs = a.positional();
        if (inputs.isEmpty()) throw new UsageException("merge needs at least one input IFile");
        Configuration conf = conf();
        FileSystem fs = rawFs(conf);
        PriorityQueue<Source> heap = new PriorityQueue<>((x, y) -> {
            int c = x.key.compareTo(y.key);
            return c != 0 ? c : Integer.compare(x.index, y.index);
        });
        List<Source> all = new ArrayList<>();
        long inRecords = 0;
        long outRecords = 0;
        try {
            for (int i = 0; i < inputs.size(); i++) {
                Source s = new Source(new RecordReader(conf, fs, Paths.get(inputs.get(i))), i);
                all.add(s);
                if (s.advance()) heap.add(s);
            }
            try (Closer<IFile.Writer<Text, IntWritable>> wc = new Closer<>(openWriter(conf, fs, out))) {
                IFile.Writer<Text, IntWritable> w = wc.get();
                Text cur = new Text();
                Text last = null;
                IntWritable sum = new IntWritable();
                while (!heap.isEmpty()) {
                    Source s = heap.poll();
                    inRecords++;
                    cur.set(s.key);
                    long acc = s.value.get();
                    if (last != null && last.compareTo(cur) >= 0) {
                        throw new IOException("input " + inputs.get(s.index) + " is not sorted at key '" + cur + "'");
                    }
                    if (s.advance()) heap.add(s);
                    while (!heap.isEmpty() && heap.peek().key.equals(cur)) {
                        Source t = heap.poll();
                        inRecords++;
                        acc += t.value.get();
                        if (t.advance()) heap.add(t);
                    }
                    if (acc > Integer.MAX_VALUE) throw new IOException("count overflow at key '" + cur + "'");
                    sum.set((int) acc);
                    w.append(cur, sum);
                    outRecords++;
                    last = new Text(cur);
                }
            }
        } finally {
            for (Source s : all) s.rr.close();
        }
        System.out.printf("%s in-records=%d out-records=%d bytes=%d%n", out, inRecords, outRecords, Files.size(out));
        return EXIT_OK;
    }

    // ------------------------------------------------------------------ dump

    static int dump(Args a) throws IOException {
        Path in = Paths.get(a.required("--in"));
        long limit = a.longOpt("--limit", Long.MAX_VALUE);
        a.noPositional();
        Configuration conf = conf();
        FileSystem fs = rawFs(conf);
        PrintStream out = new PrintStream(new java.io.BufferedOutputStream(System.out, 1 << 16), false,
            StandardCharsets.UTF_8);
        long n = 0;
        try (RecordReader rr = new RecordReader(conf, fs, in)) {
            Text k = new Text();
            IntWritable v = new IntWritable();
            while (rr.next(k, v)) {
                if (n < limit) out.println(k + "\t" + v.get());
                n++;
            }
        } finally {
            out.flush();
        }
        System.err.println("records=" + n);
        return EXIT_OK;
    }

    // ------------------------------------------------------------------ inspect (no Hadoop)

    /** Hadoop WritableUtils VInt/VLong decoding, re-implemented from the spec. */
    static long[] readVLong(byte[] b, int pos) throws IOException {
        if (pos >= b.length) throw new IOException("truncated VInt at offset " + pos);
        byte first = b[pos];
        if (first >= -112) return new long[] {first, 1};
        boolean negative = first < -120;
        int n = negative ? -(first + 120) : -(first + 112); // number of following bytes
        if (pos + 1 + n > b.length) throw new IOException("truncated VInt at offset " + pos);
        long v = 0;
        for (int i = 1; i <= n; i++) v = (v << 8) | (b[pos + i] & 0xff);
        return new long[] {negative ? ~v : v, 1 + n};
    }

    static String hex(byte[] b, int from, int to) {
        StringBuilder sb = new StringBuilder();
        for (int i = from; i < to; i++) {
            if (i > from) sb.append(' ');
            sb.append(String.format("%02x", b[i] & 0xff));
        }
        return sb.toString();
    }

    static int inspect(Args a) throws IOException {
        Path in = Paths.get(a.required("--in"));
        int show = a.intOpt("--show", 3);
        a.noPositional();
        byte[] b = Files.readAllBytes(in);
        if (b.length < 6) {
            System.out.println("FAIL " + in + ": too short (" + b.length + " bytes)");
            return EXIT_FAIL;
        }
        int dataLen = b.length - 4;
        int pos = 0;
        long records = 0;
        boolean eof = false;
        try {
            while (pos < dataLen) {
                int start = pos;
                long[] kl = readVLong(b, pos); pos += (int) kl[1];
                long[] vl = readVLong(b, pos); pos += (int) vl[1];
                if (kl[0] == -1 && vl[0] == -1) {
                    System.out.printf("EOF marker at offset %d: %s%n", start, hex(b, start, pos));
                    eof = true;
                    break;
                }
                if (kl[0] < 0 || vl[0] < 0 || pos + kl[0] + vl[0] > dataLen) {
                    throw new IOException("bad record lengths key=" + kl[0] + " value=" + vl[0] + " at offset " + start);
                }
                int keyStart = pos;
                pos += (int) (kl[0] + vl[0]);
                if (records < show) {
                    long[] tl = readVLong(b, keyStart);
                    String word = new String(b, keyStart + (int) tl[1], (int) tl[0], StandardCharsets.UTF_8);
                    int valStart = keyStart + (int) kl[0];
                    System.out.printf("record %d at offset %d: keyLen=%d valueLen=%d | %s | %s || %s | text='%s' value=%d%n",
                        records, start, kl[0], vl[0],
                        hex(b, start, start + (int) kl[1]), hex(b, start + (int) kl[1], keyStart),
                        hex(b, keyStart, pos), word,
                        vl[0] == 4 ? java.nio.ByteBuffer.wrap(b, valStart, 4).getInt() : -1);
                }
                records++;
            }
        } catch (IOException e) {
            System.out.println("FAIL " + in + ": " + e.getMessage());
            return EXIT_FAIL;
        }
        if (!eof) {
            System.out.println("FAIL " + in + ": no EOF marker before the trailer");
            return EXIT_FAIL;
        }
        if (pos != dataLen) {
            System.out.printf("FAIL %s: %d unexpected bytes between EOF marker and trailer%n", in, dataLen - pos);
            return EXIT_FAIL;
        }
        CRC32 crc = new CRC32();
        crc.update(b, 0, dataLen);
        long stored = java.nio.ByteBuffer.wrap(b, dataLen, 4).getInt() & 0xffffffffL;
        System.out.printf("trailer at offset %d: %s (big-endian CRC32 %08x), computed CRC32 of bytes [0,%d) = %08x%n",
            dataLen, hex(b, dataLen, b.length), stored, dataLen, crc.getValue());
        if (stored != crc.getValue()) {
            System.out.println("FAIL " + in + ": CRC32 mismatch");
            return EXIT_FAIL;
        }
        System.out.printf("records=%d, bytes=%d, layout ok%n", records, b.length);
        return EXIT_OK;
    }

    // ------------------------------------------------------------------ small helpers

    /** try-with-resources adapter for IFile.Writer (which is not Closeable in all versions). */
    static final class Closer<W extends IFile.Writer<?, ?>> implements AutoCloseable {
        private final W w;

        Closer(W w) {
            this.w = w;
        }

        W get() {
            return w;
        }

        @Override
        public void close() throws IOException {
            w.close();
        }
    }

    static final class UsageException extends RuntimeException {
        UsageException(String m) {
            super(m);
        }
    }

    /** Minimal option parser: --name value, boolean --flags, positional args. */
    static final class Args {
        private final Map<String, String> opts = new HashMap<>();
        private final java.util.Set<String> flags = new java.util.HashSet<>();
        private final List<String> positional = new ArrayList<>();
        private static final java.util.Set<String> FLAG_NAMES =
            java.util.Set.of("--combine", "--no-text", "--allow-duplicates");

        Args(String[] argv) {
            for (int i = 0; i < argv.length; i++) {
                String s = argv[i];
                if (FLAG_NAMES.contains(s)) {
                    flags.add(s);
                } else if (s.startsWith("--")) {
                    int eq = s.indexOf('=');
                    if (eq > 0) {
                        opts.put(s.substring(0, eq), s.substring(eq + 1));
                    } else {
                        if (i + 1 >= argv.length) throw new UsageException("option " + s + " needs a value");
                        opts.put(s, argv[++i]);
                    }
                } else {
                    positional.add(s);
                }
            }
        }

        String required(String name) {
            String v = opts.remove(name);
            if (v == null) throw new UsageException("missing " + name);
            return v;
        }

        int intOpt(String name, int def) {
            String v = opts.remove(name);
            try {
                return v == null ? def : Integer.parseInt(v);
            } catch (NumberFormatException e) {
                throw new UsageException(name + " needs an integer");
            }
        }

        long longOpt(String name, long def) {
            String v = opts.remove(name);
            try {
                return v == null ? def : Long.parseLong(v);
            } catch (NumberFormatException e) {
                throw new UsageException(name + " needs an integer");
            }
        }

        boolean flag(String name) {
            return flags.remove(name);
        }

        List<String> positional() {
            checkUnknown();
            return positional;
        }

        void noPositional() {
            checkUnknown();
            if (!positional.isEmpty()) throw new UsageException("unexpected argument " + positional.get(0));
        }

        private void checkUnknown() {
            if (!opts.isEmpty()) throw new UsageException("unknown option " + opts.keySet().iterator().next());
            if (!flags.isEmpty()) throw new UsageException("option " + flags.iterator().next() + " not valid here");
        }
    }
}
