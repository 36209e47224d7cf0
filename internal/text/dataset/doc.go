// Package dataset turns text into the token sequences that calibration and
// evaluation run on, and says exactly where they came from.
//
// A data spec (ParseSpec) names the sources: JSONL files whose records are
// plain text, chats ("messages") or prompt/completion pairs, plain .txt
// files, and directory trees of source files, each with a corpus label and
// a mixture weight. Build reads them, splits the records between a
// calibration and an evaluation set by a seeded hash of their content,
// tokenizes them with the model's tokenizer, and cuts N sequences of L
// tokens per set (packed with a separator, or one record each), with a
// mask of the tokens to score and the corpus label of every sequence. The
// Provenance it returns holds the files' SHA-256, the options and the
// token-id hash in the calibration store's convention (HashTokenIDs).
//
// Bad input is an error naming the file and line, and Build then returns
// nothing. docs/data.md describes the formats and the rules.
package dataset
