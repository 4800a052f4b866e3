// placeholder until the io layer lands
namespace moetrain {}
