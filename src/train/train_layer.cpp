// placeholder until the train layer lands
namespace moetrain {}
