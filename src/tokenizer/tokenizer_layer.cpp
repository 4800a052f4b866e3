// placeholder until the tokenizer layer lands
namespace moetrain {}
